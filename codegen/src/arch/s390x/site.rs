//! s390x patch site: the 6-byte NOP (`brcl 0,0`, or three `nopr`) becomes
//! `brasl %r0,target`: r0 = the address after the site, r14 keeps the
//! traced function's return address.  Reach: ±4 GiB, target 2-byte aligned.
//!
//! ```text
//!   disabled  c0 04 00 00 00 00   brcl  0,0        (or 07 00 07 00 07 00)
//!   enabled   c0 05 ii ii ii ii   brasl %r0,target (ii = (target-site)/2, big-endian)
//! ```

use super::emit::insn::{self, Gpr, Rel32};
use super::ARCH;
use crate::program::CodegenError;

/// The enabled form at `site` calling `target`.
pub fn call(site: u64, target: u64) -> Result<Vec<u8>, CodegenError> {
    for (what, addr) in [("patch site address", site), ("brasl target address", target)] {
        if !addr.is_multiple_of(2) {
            return Err(CodegenError::OutOfRange { arch: ARCH, what, value: addr as i64, range: "2-byte aligned" });
        }
    }
    let rel = Rel32::from_bytes("brasl from a patch site", target.wrapping_sub(site) as i64)?;
    Ok(insn::brasl(Gpr::R0, rel).to_vec())
}
