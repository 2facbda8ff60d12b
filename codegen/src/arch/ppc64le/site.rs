//! ppc64le patch site (gcc `-pg -mprofile-kernel`): the 8 bytes
//! `mflr r0 ; nop` become `mflr r0 ; bl target`.
//!
//! The first word is the same in the disabled and the enabled form, so the
//! runtime only rewrites the second one (one aligned 4-byte store).  The `bl`
//! sets LR to the address after the site; `mflr r0` has put the traced
//! function's return address in r0.

use super::emit::enc::Insn;
use crate::program::CodegenError;

/// `mflr r0`.
pub const MFLR_R0: Insn = Insn::Mfspr { rt: 0, spr: super::emit::enc::Spr::Lr };

/// The 8-byte enabled form at `site` calling `target` (±32 MiB from the `bl`).
pub fn call(site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
    let bl = Insn::Bl { off: target.wrapping_sub(site + 4) as i64 };
    let mut out = MFLR_R0.bytes()?.to_vec();
    out.extend_from_slice(&bl.bytes()?);
    Ok(out)
}
