//! A test that plays a second process: the test binary started again, running one test in a
//! role, so a test can kill a client process (SIGKILL) while it holds or waits.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Starts this very test binary again as a child that runs only `test`, with the environment
/// `env` (the test reads its role from there first), and waits until the child prints a line
/// ending in `READY`. Panics when it does not within 20 s.
pub fn spawn_role(test: &str, env: &[(&str, &str)]) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.trim_end().ends_with("READY") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the child process never became READY");
    child
}
