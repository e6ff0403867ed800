//! A real Werkzeug app server (Flask's), for what a Python app reads: it
//! answers every request 200 with `X-App-User: user:password` as Werkzeug
//! decoded `Authorization: Basic`, or `X-App-User: -` when it read none.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const APP: &str = r#"
import sys
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

@Request.application
def app(request):
    auth = request.authorization
    user = "-" if auth is None or auth.type != "basic" else f"{auth.username}:{auth.password}"
    return Response("ok", headers={"X-App-User": user})

server = make_server("127.0.0.1", 0, app)
print(server.server_port, flush=True)
server.serve_forever()
"#;

pub struct Werkzeug {
    child: Child,
    port: u16,
}

impl Werkzeug {
    /// Starts the app on a free port; panics (the test fails, never
    /// skips) when python3 or Werkzeug is missing.
    pub fn start() -> Werkzeug {
        let mut child = Command::new("python3")
            .args(["-c", APP])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 (scripts/test.sh installs Werkzeug)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("the app's port");
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("Werkzeug did not start: {line:?}"));
        Werkzeug { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Werkzeug {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
