//! Seeds and a small generator for the seeded randomized tests: a failure prints its seed, the
//! seed replays the run.

/// A splitmix64 generator: fast, good enough for scheduling choices, and the same sequence for
/// the same seed on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0; the modulo bias is irrelevant at the sizes tests use).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A generator of its own for worker `i` of a run with seed `seed`.
    pub fn for_worker(seed: u64, i: u64) -> Self {
        Rng(seed ^ (i + 1).wrapping_mul(0x2545_F491_4F6C_DD1D))
    }
}

/// The seed of a seeded test: `var` from the environment when set (a replay), else a fresh one
/// from the clock. Printed on stderr either way (`cargo nextest` shows it with a failure), as
/// `seeded run: VAR=seed`.
pub fn seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
        });
    eprintln!("seeded run: {var}={seed}");
    seed
}
