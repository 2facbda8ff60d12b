//! A cheap clock for timestamps: raw CPU ticks, converted to
//! `CLOCK_MONOTONIC` nanoseconds by one calibration.
//!
//! Why: `clock_gettime` costs 20–50 ns on the VMs we run on (more than a
//! traced call), while `rdtsc` / `cntvct_el0` cost a few.  Tracers take
//! [`ticks`] on the hot path and convert later ([`Clock::to_ns`]).
//!
//! * x86_64: the TSC, when `/proc/cpuinfo` says it is `constant_tsc` and
//!   `nonstop_tsc` (same rate on every CPU, across idle states), calibrated
//!   against `CLOCK_MONOTONIC` over ~4 ms;
//! * aarch64: the virtual counter `cntvct_el0` at `cntfrq_el0` Hz
//!   (architecturally constant and shared by all CPUs), aligned with
//!   `CLOCK_MONOTONIC` at calibration;
//! * anything else, or a TSC we don't trust: `CLOCK_MONOTONIC` itself
//!   (ticks are nanoseconds).
//!
//! Ticks are consistent across threads.  A process can inherit another's
//! calibration through the environment (`FTRAMP_CLOCK`, see
//! [`Clock::env_value`]), so all processes of one trace share one
//! conversion.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::OnceLock;

/// Where ticks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockKind {
    /// x86_64 `rdtsc`.
    Tsc,
    /// aarch64 `cntvct_el0`.
    Cntvct,
    /// `clock_gettime(CLOCK_MONOTONIC)` in ns.
    Monotonic,
}

impl ClockKind {
    pub fn name(self) -> &'static str {
        match self {
            ClockKind::Tsc => "tsc",
            ClockKind::Cntvct => "cntvct",
            ClockKind::Monotonic => "monotonic",
        }
    }

    fn parse(s: &str) -> Option<ClockKind> {
        [ClockKind::Tsc, ClockKind::Cntvct, ClockKind::Monotonic].into_iter().find(|k| k.name() == s)
    }
}

/// A calibration: `ns = base_ns + (ticks - base_ticks) * 1e9 / ticks_per_sec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clock {
    pub kind: ClockKind,
    pub ticks_per_sec: u64,
    pub base_ticks: u64,
    /// `CLOCK_MONOTONIC` ns at `base_ticks`.
    pub base_ns: u64,
}

/// The environment variable [`clock`] reads a calibration from.
pub const ENV: &str = "FTRAMP_CLOCK";

const KIND_UNSET: u8 = 0;
const KIND_TSC: u8 = 1;
const KIND_CNTVCT: u8 = 2;
const KIND_MONO: u8 = 3;
/// What [`ticks`] reads; set by [`clock`].
static KIND: AtomicU8 = AtomicU8::new(KIND_UNSET);
/// [`ticks_to_ns`]' calibration: base ticks, base ns, and ns per tick as
/// 64.64 fixed point (low, high word): multiplications instead of a
/// 128-bit division.
static FAST: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

impl Clock {
    /// Ticks to `CLOCK_MONOTONIC` nanoseconds (ticks before the base map
    /// to earlier times; 128-bit arithmetic, no overflow).
    pub fn to_ns(&self, ticks: u64) -> u64 {
        let d = ticks as i128 - self.base_ticks as i128;
        let ns = self.base_ns as i128 + d * 1_000_000_000 / self.ticks_per_sec.max(1) as i128;
        ns.clamp(0, u64::MAX as i128) as u64
    }

    /// A tick count as a duration in ns.
    pub fn delta_ns(&self, ticks: u64) -> u64 {
        (ticks as u128 * 1_000_000_000 / self.ticks_per_sec.max(1) as u128).min(u64::MAX as u128) as u64
    }

    /// `kind:ticks_per_sec:base_ticks:base_ns`, what [`ENV`] holds.
    pub fn env_value(&self) -> String {
        format!("{}:{}:{}:{}", self.kind.name(), self.ticks_per_sec, self.base_ticks, self.base_ns)
    }

    /// Parses [`Clock::env_value`]; `None` if malformed or if the kind
    /// cannot be read on this machine.
    pub fn from_env_value(s: &str) -> Option<Clock> {
        let mut it = s.trim().split(':');
        let kind = ClockKind::parse(it.next()?)?;
        let c = Clock {
            kind,
            ticks_per_sec: it.next()?.parse().ok().filter(|&t| t > 0)?,
            base_ticks: it.next()?.parse().ok()?,
            base_ns: it.next()?.parse().ok()?,
        };
        if it.next().is_some() || !available(kind) {
            return None;
        }
        Some(c)
    }
}

fn available(kind: ClockKind) -> bool {
    match kind {
        ClockKind::Tsc => cfg!(target_arch = "x86_64") && tsc_reliable(),
        ClockKind::Cntvct => cfg!(target_arch = "aarch64"),
        ClockKind::Monotonic => true,
    }
}

/// `CLOCK_MONOTONIC` in ns.
#[inline(never)]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own; async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn raw_tsc() -> u64 {
    // SAFETY: rdtsc has no memory effects; every x86_64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn raw_cntvct() -> u64 {
    let v: u64;
    // SAFETY: reads the virtual counter, which Linux lets user space read
    // (CNTKCTL_EL1.EL0VCTEN); no memory effects.
    unsafe { std::arch::asm!("isb", "mrs {}, cntvct_el0", out(reg) v, options(nomem, nostack, preserves_flags)) };
    v
}

#[cfg(target_arch = "aarch64")]
fn cntfrq() -> u64 {
    let v: u64;
    // SAFETY: reads the counter frequency register; no memory effects.
    unsafe { std::arch::asm!("mrs {}, cntfrq_el0", out(reg) v, options(nomem, nostack, preserves_flags)) };
    v
}

/// The current tick count of [`clock`]'s kind (calibrates on first use).
#[inline]
pub fn ticks() -> u64 {
    match KIND.load(Relaxed) {
        #[cfg(target_arch = "x86_64")]
        KIND_TSC => raw_tsc(),
        #[cfg(target_arch = "aarch64")]
        KIND_CNTVCT => raw_cntvct(),
        KIND_MONO => monotonic_ns(),
        _ => ticks_first(),
    }
}

/// [`ticks`] before the calibration (out of the hot paths' way).
#[cold]
#[inline(never)]
fn ticks_first() -> u64 {
    clock();
    ticks()
}

/// [`Clock::to_ns`] of the process clock for hot paths: one 64×64
/// multiplication (within ~1 ns of [`Clock::to_ns`]).
/// Call [`clock`] (or [`ticks`]) once before.
#[inline]
pub fn ticks_to_ns(ticks: u64) -> u64 {
    Fast::load().to_ns(ticks)
}

/// [`ticks_to_ns`] of two tick counts (a call's entry and exit) with one
/// read of the calibration.
#[inline]
pub fn ticks_pair_to_ns(a: u64, b: u64) -> (u64, u64) {
    let f = Fast::load();
    (f.to_ns(a), f.to_ns(b))
}

/// A copy of [`FAST`].
struct Fast {
    base_ticks: u64,
    base_ns: u64,
    lo: u128,
    hi: u128,
}

impl Fast {
    #[inline(always)]
    fn load() -> Fast {
        Fast { base_ticks: FAST[0].load(Relaxed), base_ns: FAST[1].load(Relaxed), lo: FAST[2].load(Relaxed) as u128, hi: FAST[3].load(Relaxed) as u128 }
    }

    #[inline(always)]
    fn to_ns(&self, ticks: u64) -> u64 {
        let d = ticks.wrapping_sub(self.base_ticks) as i64;
        let scale = |d: u64| ((d as u128 * self.hi) + ((d as u128 * self.lo) >> 64)) as u64;
        if d >= 0 {
            self.base_ns.wrapping_add(scale(d as u64))
        } else {
            self.base_ns.saturating_sub(scale(d.unsigned_abs()))
        }
    }
}

/// `ticks()` as `CLOCK_MONOTONIC` ns.
pub fn now_ns() -> u64 {
    let t = ticks();
    clock().to_ns(t)
}

fn tsc_reliable() -> bool {
    static R: OnceLock<bool> = OnceLock::new();
    *R.get_or_init(|| {
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return false };
        let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
        let has = |f: &str| flags.split_whitespace().any(|w| w == f);
        has("constant_tsc") && has("nonstop_tsc")
    })
}

/// The process's calibration: from [`ENV`] when it holds a usable one,
/// else measured now.
pub fn clock() -> &'static Clock {
    static C: OnceLock<Clock> = OnceLock::new();
    C.get_or_init(|| {
        let c = std::env::var(ENV).ok().and_then(|v| Clock::from_env_value(&v)).unwrap_or_else(calibrate);
        FAST[0].store(c.base_ticks, Relaxed);
        FAST[1].store(c.base_ns, Relaxed);
        let mult = (1_000_000_000u128 << 64) / c.ticks_per_sec.max(1) as u128;
        FAST[2].store(mult as u64, Relaxed);
        FAST[3].store((mult >> 64) as u64, Relaxed);
        KIND.store(
            match c.kind {
                ClockKind::Tsc => KIND_TSC,
                ClockKind::Cntvct => KIND_CNTVCT,
                ClockKind::Monotonic => KIND_MONO,
            },
            Relaxed,
        );
        c
    })
}

/// Measures a calibration for this machine.
pub fn calibrate() -> Clock {
    #[cfg(target_arch = "x86_64")]
    if tsc_reliable() {
        // Pair each monotonic read with the TSC read in its middle; take the
        // pair with the shortest window at both ends of ~4 ms.
        let sample = || {
            (0..16)
                .map(|_| {
                    let a = monotonic_ns();
                    let t = raw_tsc();
                    let b = monotonic_ns();
                    (b - a, t, a + (b - a) / 2)
                })
                .min()
                .map(|(_, t, ns)| (t, ns))
                .expect("16 samples")
        };
        let (t0, n0) = sample();
        // 4 ms: each end is known to ~50 ns, so ~12 ppm (12 ns per ms of
        // duration); every `ftramp record` waits for it once.
        std::thread::sleep(std::time::Duration::from_millis(4));
        let (t1, n1) = sample();
        if n1 > n0 && t1 > t0 {
            let ticks_per_sec = ((t1 - t0) as u128 * 1_000_000_000 / (n1 - n0) as u128) as u64;
            return Clock { kind: ClockKind::Tsc, ticks_per_sec, base_ticks: t0, base_ns: n0 };
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let f = cntfrq();
        if f > 0 {
            let a = monotonic_ns();
            let t = raw_cntvct();
            let b = monotonic_ns();
            return Clock { kind: ClockKind::Cntvct, ticks_per_sec: f, base_ticks: t, base_ns: a + (b - a) / 2 };
        }
    }
    let n = monotonic_ns();
    Clock { kind: ClockKind::Monotonic, ticks_per_sec: 1_000_000_000, base_ticks: n, base_ns: n }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_value_round_trips_and_rejects_garbage() {
        let c = Clock { kind: ClockKind::Monotonic, ticks_per_sec: 1_000_000_000, base_ticks: 5, base_ns: 7 };
        assert_eq!(Clock::from_env_value(&c.env_value()), Some(c));
        for bad in ["", "monotonic", "monotonic:0:1:2", "monotonic:1:2", "monotonic:1:2:3:4", "bogus:1:2:3", "monotonic:x:2:3"] {
            assert_eq!(Clock::from_env_value(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn conversion_is_linear_and_exact_at_the_base() {
        let c = Clock { kind: ClockKind::Tsc, ticks_per_sec: 3_000_000_000, base_ticks: 1_000, base_ns: 50 };
        assert_eq!(c.to_ns(1_000), 50);
        assert_eq!(c.to_ns(1_000 + 3_000_000_000), 50 + 1_000_000_000);
        assert_eq!(c.to_ns(1_000 + 3), 51);
        assert_eq!(c.to_ns(0), 0, "before the base clamps at 0 when negative");
        assert_eq!(c.delta_ns(6_000), 2_000);
    }

    #[test]
    fn ticks_follow_the_monotonic_clock() {
        let c = clock();
        let (n0, t0) = (monotonic_ns(), ticks());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (t1, n1) = (ticks(), monotonic_ns());
        assert!(t1 > t0, "ticks advance");
        let (a, b) = (c.to_ns(t0), c.to_ns(t1));
        // Converted times agree with CLOCK_MONOTONIC within 2 ms and the
        // measured interval within 10 %.
        assert!(a.abs_diff(n0) < 2_000_000, "{a} vs {n0} ({:?})", c);
        let (d, m) = (b - a, n1 - n0);
        assert!(d.abs_diff(m) * 10 < m, "interval {d} ns vs monotonic {m} ns ({:?})", c);
        // The fast conversion agrees with the exact one.
        let hour = c.ticks_per_sec * 3600;
        for t in [t0, t1, c.base_ticks, c.base_ticks.saturating_sub(12345), c.base_ticks + hour, c.base_ticks + 24 * hour] {
            assert!(ticks_to_ns(t).abs_diff(c.to_ns(t)) <= 2, "{t}: {} vs {}", ticks_to_ns(t), c.to_ns(t));
        }
    }
}
