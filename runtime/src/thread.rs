//! The runtime's one thread-local block.
//!
//! A traced call touches the dispatch word ([`crate::grace`]) and the
//! shadow stack ([`crate::fgraph`]) on the way in and on the way out.  In a
//! shared library (the `ftramp record` preload, `libftramp.so`) every
//! distinct thread-local costs a `__tls_get_addr` call per function that
//! uses it; kept in one block, the compiler computes its address once per
//! function.  The block has no destructor, so it is reached without a
//! liveness check and lives at a fixed address until the thread is gone.

use crate::fgraph::Shadow;
use std::sync::atomic::AtomicU64;

pub(crate) struct ThreadState {
    /// `grace`'s dispatch word (generation << 32 | depth).  Written only by
    /// this thread (and by signal handlers on it, which restore it); read
    /// by the grace-period handler, which also runs on this thread.
    pub(crate) dispatch: AtomicU64,
    /// `fgraph`'s shadow stack.
    pub(crate) shadow: Shadow,
}

thread_local! {
    static THREAD: ThreadState = const { ThreadState { dispatch: AtomicU64::new(0), shadow: Shadow::new() } };
}

/// This thread's block, as a plain reference so that hot paths compute its
/// address once.
#[inline(always)]
pub(crate) fn this() -> &'static ThreadState {
    // SAFETY: the block has no destructor, so the thread-local lives at a
    // fixed address until the thread is gone; `ThreadState` is not `Sync`
    // (the shadow stack's Cells), so the reference never reaches another
    // thread.
    THREAD.with(|t| unsafe { &*(t as *const ThreadState) })
}
