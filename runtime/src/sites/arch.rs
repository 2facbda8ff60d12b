//! Per-architecture facts about compiled sites that the spec does not
//! carry: landing pads a compiler puts before the patchable NOPs, and the
//! start-up NOP rewrites.  Every byte string here is checked against the
//! host spec by the unit tests below (rewrites must go from one of the
//! spec's NOP forms to another).

use crate::HOST_ARCH;

/// Branch-target landing pads that may sit at a function's symbol, before
/// the NOPs of an `-fpatchable-function-entry=N,M` site (M > 0):
/// x86_64 `endbr64` under `-fcf-protection`; aarch64 `bti c` / `bti jc`
/// under `-mbranch-protection`.  (With M = 0 the compiler records the
/// address after the pad, so nothing needs skipping.)
pub fn landing_pads() -> &'static [&'static [u8]] {
    match HOST_ARCH {
        "x86_64" => &[&[0xf3, 0x0f, 0x1e, 0xfa]],
        // hint #34 (bti c) = 0xd503245f, hint #38 (bti jc) = 0xd50324df.
        "aarch64" => &[&[0x5f, 0x24, 0x03, 0xd5], &[0xdf, 0x24, 0x03, 0xd5]],
        _ => &[],
    }
}

/// NOP forms rewritten at start-up into a cheaper equivalent (as Linux's
/// `ftrace_init_nop`): `(from, to)`, same length.
///
/// * x86_64: gcc's five one-byte `nop`s become the single 5-byte
///   `nopl 0x0(%rax,%rax,1)` clang emits (one instruction to decode
///   instead of five).
/// * aarch64: the only form is already two single NOP instructions.
/// * others: none yet (their backends' authors decide).
pub(crate) fn nop_rewrites() -> &'static [(&'static [u8], &'static [u8])] {
    match HOST_ARCH {
        "x86_64" => &[(&[0x90, 0x90, 0x90, 0x90, 0x90], &[0x0f, 0x1f, 0x44, 0x00, 0x00])],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_spec;

    #[test]
    fn rewrites_are_between_spec_nop_forms() {
        let spec = host_spec();
        for (from, to) in nop_rewrites() {
            assert!(spec.nops.iter().any(|n| n == from), "{from:02x?} is not a NOP form of {HOST_ARCH}");
            assert!(spec.nops.iter().any(|n| n == to), "{to:02x?} is not a NOP form of {HOST_ARCH}");
            assert_ne!(from, to);
        }
    }

    #[test]
    fn rewrites_only_where_patching_is_live() {
        // optimize_nops may run while other threads execute the sites.
        assert!(nop_rewrites().is_empty() || crate::patch::LIVE_PATCHING);
    }

    #[test]
    fn landing_pads_are_not_nops() {
        for pad in landing_pads() {
            assert!(!host_spec().nops.iter().any(|n| n.starts_with(pad)));
        }
    }
}
