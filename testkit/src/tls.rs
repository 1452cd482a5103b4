//! Throw-away TLS material (a CA, a server certificate for 127.0.0.1 and a client certificate,
//! made with the `openssl` command) and a `redis-server` that serves TLS with it.
//!
//! The server is Debian's `redis-server` on PATH whatever server the suite is testing
//! ([`RedisServer::start_tls_capable_with`]): TLS is a client feature, and the PyPI builds of
//! Redis 6.2 and Valkey 8 have no TLS.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::server::{RedisServer, WorkDir};

/// A CA with a server and a client certificate in one work dir (removed on drop).
pub struct TlsFiles {
    dir: WorkDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect(
            "`openssl` is needed to make test certificates: run `bash scripts/install-redis.sh`",
        );
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

impl TlsFiles {
    /// Makes the CA (`ca.pem`), a server certificate for IP 127.0.0.1 (`server.pem`,
    /// `server.key`) and a client certificate (`client.pem`, `client.key`), all signed by the CA.
    pub fn generate() -> TlsFiles {
        let dir = WorkDir::new("tls");
        let d = dir.path();
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=fairlock test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        );
        std::fs::write(
            d.join("server.cnf"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        std::fs::write(
            d.join("client.cnf"),
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        for (who, subject) in [
            ("server", "/CN=127.0.0.1"),
            ("client", "/CN=fairlock test client"),
        ] {
            let (key, csr, pem, ext) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.pem"),
                format!("{who}.cnf"),
            );
            openssl(
                d,
                &[
                    "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", &key,
                    "-out", &csr,
                ],
            );
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "1",
                    "-out",
                    &pem,
                    "-extfile",
                    &ext,
                ],
            );
        }
        TlsFiles { dir }
    }

    /// The path of one of the files (`ca.pem`, `server.pem`, `client.key`, …).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// The contents of one of the files.
    pub fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.path(file)).unwrap()
    }

    /// A server that also listens for TLS on the returned port, with this CA's server
    /// certificate; `client_certs` makes it require a client certificate signed by the CA. Its
    /// plain port ([`RedisServer::url`]) stays open for the test's own checks.
    pub fn start_server(&self, client_certs: bool) -> (RedisServer, u16) {
        let tls_port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let p = |f: &str| self.path(f).to_string_lossy().into_owned();
        let port = tls_port.to_string();
        let server = RedisServer::start_tls_capable_with(&[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &p("server.pem"),
            "--tls-key-file",
            &p("server.key"),
            "--tls-ca-cert-file",
            &p("ca.pem"),
            "--tls-auth-clients",
            if client_certs { "yes" } else { "no" },
        ]);
        (server, tls_port)
    }
}
