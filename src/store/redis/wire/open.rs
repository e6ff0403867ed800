//! Opening a connection: TCP, TLS, `AUTH`, `SELECT`.

use redis::{ConnectionAddr, ConnectionInfo, ProtocolVersion, RedisError, RedisResult};
use tokio::net::TcpStream;

use super::{Stream, Wire};

/// Opens a connection to the node `info` names: TCP (and TLS through
/// `tls`), then `AUTH` and `SELECT` as the URL asks. `None` when `info` is
/// not something this connection speaks (a Unix socket, TLS without
/// hostname checks, RESP3): redis-rs's connection serves those.
pub async fn open(
    info: &ConnectionInfo,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Option<RedisResult<Wire>> {
    let settings = info.redis_settings();
    if settings.protocol() != ProtocolVersion::RESP2 {
        return None;
    }
    let (host, port, tls) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => (host, *port, None),
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            ..
        } => (host, *port, Some(tls?)),
        _ => return None,
    };
    Some(handshake(host, port, tls, settings).await)
}

/// [`open`] of the node at `host`:`port`, with `settings`' credentials
/// and database, through `tls` when given.
pub async fn handshake(
    host: &str,
    port: u16,
    tls: Option<&tokio_rustls::TlsConnector>,
    settings: &redis::RedisConnectionInfo,
) -> RedisResult<Wire> {
    let tcp = TcpStream::connect((host, port)).await?;
    // Small writes on a shared socket must not wait for ACKs.
    tcp.set_nodelay(true)?;
    let stream = match tls {
        None => Stream::Plain(tcp),
        Some(tls) => {
            let name = rustls_pki_types::ServerName::try_from(host.to_owned()).map_err(|_| {
                RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "store.redis: the host is not a valid TLS server name",
                ))
            })?;
            Stream::Tls(Box::new(tls.connect(name, tcp).await?))
        }
    };
    let wire = Wire::start(stream);
    if let Some(password) = settings.password() {
        let mut auth = redis::cmd("AUTH");
        if let Some(user) = settings.username() {
            auth.arg(user);
        }
        auth.arg(password);
        wire.call(&auth).await?.value()?;
    }
    if settings.db() != 0 {
        wire.call(redis::cmd("SELECT").arg(settings.db()))
            .await?
            .value()?;
    }
    // Names the client in `CLIENT LIST`; a Redis before 7.2, or a user
    // without `+client`, refuses it, which changes nothing.
    let mut name = redis::cmd("CLIENT");
    name.arg("SETINFO")
        .arg("LIB-NAME")
        .arg(concat!("sluice-", env!("CARGO_PKG_VERSION")));
    let _ = wire.call(&name).await?.value();
    Ok(Wire {
        db: settings.db(),
        ..wire
    })
}
