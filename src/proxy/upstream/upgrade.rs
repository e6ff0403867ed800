//! Upgraded connections (WebSocket and other HTTP/1.1 `Upgrade`s): once
//! both sides have switched protocols, bytes are copied both ways until one
//! side closes.
//!
//! hyper hands an upgraded connection over and forgets it, so graceful
//! shutdown does not see tunnels. [`Tunnels`] keeps track of them: on
//! shutdown they may run on until the grace deadline, then they are cut.
//! sluice does not speak the tunnelled protocol, so it cannot close one
//! more politely than that.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use tokio::time::Instant;

pub struct Tunnels {
    /// `true` cuts every tunnel. Each tunnel holds a receiver, so "no
    /// receivers left" means "no tunnel left".
    cut: watch::Sender<bool>,
}

impl Tunnels {
    pub fn new() -> Tunnels {
        let (cut, _) = watch::channel(false);
        Tunnels { cut }
    }

    /// Joins the client's and the upstream's upgraded connections once both
    /// are ready (the client's only after its 101 has been written).
    pub fn spawn(&self, client: OnUpgrade, upstream: OnUpgrade) {
        let mut cut = self.cut.subscribe();
        tokio::spawn(async move {
            let tunnel = async {
                let (client, upstream) = match tokio::try_join!(client, upstream) {
                    Ok(pair) => pair,
                    Err(error) => {
                        tracing::debug!(%error, "upgrade failed");
                        return;
                    }
                };
                let mut client = TokioIo::new(client);
                let mut upstream = TokioIo::new(upstream);
                match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                    Ok((up, down)) => tracing::debug!(up, down, "tunnel closed"),
                    Err(error) => tracing::debug!(%error, "tunnel ended"),
                }
            };
            tokio::select! {
                () = tunnel => {}
                _ = cut.wait_for(|cut| *cut) => tracing::debug!("tunnel cut at shutdown"),
            }
        });
    }

    /// Waits for every tunnel to end on its own until `deadline`, then cuts
    /// the rest and waits for them to go.
    pub async fn drain(&self, deadline: Instant) {
        if tokio::time::timeout_at(deadline, self.cut.closed())
            .await
            .is_err()
        {
            self.cut.send_replace(true);
            self.cut.closed().await;
        }
    }
}

impl Default for Tunnels {
    fn default() -> Self {
        Tunnels::new()
    }
}
