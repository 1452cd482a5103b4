//! The fault injector: a thread that stops, kills and disconnects clients, pauses, restarts and
//! flushes the server, and misbehaves through the proxies, recording every fault it injects.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock_testkit::history::mono_ns;
use fairlock_testkit::RedisServer;

use crate::check::{Fault, Scope};
use crate::config::*;
use crate::run::{signal, ChildProc, Spawner};

/// What the fault thread shares with the rest of the parent.
pub struct Shared {
    pub children: Mutex<Vec<ChildProc>>,
    pub faults: Mutex<Vec<Fault>>,
    pub frozen: Mutex<HashMap<String, u64>>,
    pub exited: Mutex<HashMap<String, u64>>,
    pub fault_counts: Mutex<BTreeMap<String, u64>>,
    pub stop: AtomicBool,
}

impl Shared {
    pub fn fault(&self, kind: &str, scope: Scope, t0: u64, t1: u64) {
        self.faults.lock().unwrap().push(Fault {
            kind: kind.to_owned(),
            scope,
            t0,
            t1,
        });
        *self
            .fault_counts
            .lock()
            .unwrap()
            .entry(kind.to_owned())
            .or_default() += 1;
    }
}

/// A sync connection that gives up quickly (the server may be paused or restarting).
pub fn admin_conn(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    Some(conn)
}

/// Sleeps for a fault's duration: the sleep IS the scenario (how long the fault lasts).
pub fn fault_sleep(d: Duration) {
    std::thread::sleep(d);
}

pub fn run_faults(
    shared: Arc<Shared>,
    server: Arc<Mutex<RedisServer>>,
    spawner: Arc<Mutex<Spawner>>,
    kinds: Vec<String>,
    seed: u64,
    until: Instant,
    tasks: usize,
) {
    let mut rng = Rng::new(seed ^ 0xfa17);
    let port = server.lock().unwrap().port();
    let mut kills = 0;
    while Instant::now() < until && !kinds.is_empty() {
        fault_sleep(rng.ms(200, 1200));
        if Instant::now() >= until {
            break;
        }
        let kind = rng.pick(&kinds).clone();
        let pick_child = |rng: &mut Rng| -> Option<(String, u32, Option<u16>)> {
            let children = shared.children.lock().unwrap();
            let live: Vec<&ChildProc> = children.iter().filter(|c| c.alive).collect();
            if live.is_empty() {
                return None;
            }
            let c = live[rng.below(live.len() as u64) as usize];
            Some((c.proc.clone(), c.pid, c.proxy.as_ref().map(|p| p.port())))
        };
        match kind.as_str() {
            "sigstop" => {
                let Some((proc, pid, _)) = pick_child(&mut rng) else {
                    continue;
                };
                let d = rng.ms(50, 1600);
                let t0 = mono_ns();
                signal(pid, libc::SIGSTOP);
                fault_sleep(d);
                signal(pid, libc::SIGCONT);
                shared.fault("sigstop", Scope::Proc(proc), t0, mono_ns());
            }
            "sigkill" => {
                if kills >= 2 {
                    continue;
                }
                kills += 1;
                let Some((proc, _, _)) = pick_child(&mut rng) else {
                    continue;
                };
                let t = {
                    let mut children = shared.children.lock().unwrap();
                    let c = children.iter_mut().find(|c| c.proc == proc).unwrap();
                    let t = mono_ns();
                    let _ = c.child.kill();
                    let _ = c.child.wait();
                    c.alive = false;
                    t
                };
                shared.frozen.lock().unwrap().insert(proc.clone(), t);
                shared.exited.lock().unwrap().insert(proc.clone(), t);
                shared.fault("sigkill", Scope::Proc(proc), t, t);
                // A replacement keeps the load up.
                let fresh = spawner.lock().unwrap().spawn(tasks);
                shared.children.lock().unwrap().push(fresh);
            }
            "clientkill" => {
                let Some((proc, _, proxy_port)) = pick_child(&mut rng) else {
                    continue;
                };
                let Some(mut conn) = admin_conn(port) else {
                    continue;
                };
                let pubsub_only = rng.chance(0.5);
                let t0 = mono_ns();
                let scope = match proxy_port {
                    Some(_) => {
                        let addrs = {
                            let children = shared.children.lock().unwrap();
                            children
                                .iter()
                                .find(|c| c.proc == proc)
                                .and_then(|c| c.proxy.as_ref())
                                .map(|p| p.upstream_addrs())
                                .unwrap_or_default()
                        };
                        for a in addrs {
                            let mut cmd = redis::cmd("CLIENT");
                            cmd.arg("KILL").arg("ADDR").arg(a.to_string());
                            if pubsub_only {
                                cmd.arg("TYPE").arg("pubsub");
                            }
                            let _: redis::RedisResult<i64> = cmd.query(&mut conn);
                        }
                        Scope::Proc(proc)
                    }
                    None => {
                        let mut cmd = redis::cmd("CLIENT");
                        cmd.arg("KILL")
                            .arg("TYPE")
                            .arg(if pubsub_only { "pubsub" } else { "normal" })
                            .arg("SKIPME")
                            .arg("yes");
                        let _: redis::RedisResult<i64> = cmd.query(&mut conn);
                        Scope::All
                    }
                };
                shared.fault("clientkill", scope, t0, mono_ns());
            }
            "pause" => {
                let Some(mut conn) = admin_conn(port) else {
                    continue;
                };
                let d = rng.ms(50, 1200);
                let mode = if rng.chance(0.5) { "WRITE" } else { "ALL" };
                let t0 = mono_ns();
                let _: redis::RedisResult<()> = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(d.as_millis() as u64)
                    .arg(mode)
                    .query(&mut conn);
                fault_sleep(d);
                shared.fault("pause", Scope::All, t0, mono_ns());
            }
            "sleep" => {
                let Some(mut conn) = admin_conn(port) else {
                    continue;
                };
                let d = rng.ms(50, 900);
                let t0 = mono_ns();
                let _: redis::RedisResult<()> = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg(format!("{:.3}", d.as_secs_f64()))
                    .query(&mut conn);
                shared.fault("sleep", Scope::All, t0, mono_ns());
            }
            "scriptflush" => {
                let Some(mut conn) = admin_conn(port) else {
                    continue;
                };
                let t0 = mono_ns();
                let _: redis::RedisResult<()> = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn);
                shared.fault("scriptflush", Scope::All, t0, mono_ns());
            }
            "restart" => {
                let t0 = mono_ns();
                server.lock().unwrap().restart();
                shared.fault("restart", Scope::All, t0, mono_ns());
            }
            "proxy" => {
                let children = shared.children.lock().unwrap();
                let with_proxy: Vec<&ChildProc> = children
                    .iter()
                    .filter(|c| c.alive && c.proxy.is_some())
                    .collect();
                if with_proxy.is_empty() {
                    continue;
                }
                let c = with_proxy[rng.below(with_proxy.len() as u64) as usize];
                let proxy = c.proxy.as_ref().unwrap();
                let proc = c.proc.clone();
                let t0 = mono_ns();
                let sub = rng.below(5);
                let d = rng.ms(50, 1200);
                let what = match sub {
                    0 => {
                        proxy.set_latency(rng.ms(5, 400), rng.ms(5, 400));
                        fault_sleep(d);
                        proxy.set_latency(Duration::ZERO, Duration::ZERO);
                        "proxy-latency"
                    }
                    1 => {
                        proxy.set_blackhole_replies(true);
                        fault_sleep(d);
                        proxy.set_blackhole_replies(false);
                        "proxy-lost-replies"
                    }
                    2 => {
                        proxy.set_blackhole_requests(true);
                        fault_sleep(d);
                        proxy.set_blackhole_requests(false);
                        "proxy-lost-requests"
                    }
                    3 => {
                        proxy.reset_all();
                        "proxy-reset"
                    }
                    _ => {
                        proxy.refuse_for(d);
                        proxy.reset_all();
                        fault_sleep(d);
                        proxy.stop_refusing();
                        "proxy-refuse"
                    }
                };
                drop(children);
                shared.fault(what, Scope::Proc(proc), t0, mono_ns());
            }
            "handoff" => {
                // A write stall or a connection reset in the first moments after a fair lock
                // passed from one holder to a waiter (a direct hand-off, usually), while the new
                // holder's hold may still run on the grant's short TTL (issue 34).
                let Some(mut conn) = admin_conn(port) else {
                    continue;
                };
                let name = *rng.pick(&FAIR_NAMES);
                let queue = format!("redisson_lock_queue:{{{name}}}");
                let watch_until = Instant::now() + Duration::from_millis(1500);
                let mut before: Option<Vec<String>> = None;
                let mut handed = false;
                while Instant::now() < watch_until && !handed {
                    let read: redis::RedisResult<(Vec<String>, i64)> =
                        redis::pipe().hkeys(name).llen(&queue).query(&mut conn);
                    let Ok((owners, queued)) = read else {
                        break;
                    };
                    handed = matches!(&before, Some(prev) if !owners.is_empty() && owners != *prev);
                    before = (queued > 0 && !owners.is_empty()).then_some(owners);
                    // Polling the lock while it changes hands: the wait is the watch itself.
                    fault_sleep(Duration::from_millis(1));
                }
                if !handed {
                    continue;
                }
                fault_sleep(rng.ms(0, 400));
                let t0 = mono_ns();
                if rng.chance(0.6) {
                    let d = rng.ms(200, 1200);
                    let _: redis::RedisResult<()> = redis::cmd("CLIENT")
                        .arg("PAUSE")
                        .arg(d.as_millis() as u64)
                        .arg("WRITE")
                        .query(&mut conn);
                    fault_sleep(d);
                    shared.fault("handoff-pause", Scope::All, t0, mono_ns());
                } else {
                    let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                        .arg("KILL")
                        .arg("TYPE")
                        .arg(if rng.chance(0.5) { "pubsub" } else { "normal" })
                        .arg("SKIPME")
                        .arg("yes")
                        .query(&mut conn);
                    shared.fault("handoff-kill", Scope::All, t0, mono_ns());
                }
            }
            other => panic!("unknown fault kind {other}"),
        }
    }
}
