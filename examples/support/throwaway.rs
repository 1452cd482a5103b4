//! A throw-away `redis-server` for the examples, used when `REDIS_URL` is not set. Included by
//! each example with `#[path]`; not an example itself.

use std::error::Error;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` that lives as long as this value.
pub struct ThrowAwayRedis {
    child: Child,
    port: u16,
}

impl ThrowAwayRedis {
    /// Starts one on a free loopback port and waits until it accepts connections.
    pub fn start() -> Result<Self, Box<dyn Error + Send + Sync>> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server ({e}); run scripts/install-redis.sh or set REDIS_URL"))?;
        let server = ThrowAwayRedis { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not start within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for ThrowAwayRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
