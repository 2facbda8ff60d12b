//! `cargo bench -p ftrace-ops`: the ftrace-ops configurations side by side
//! (and XRay's no-op handler).  `cargo bench -p ftrace-ops -- --callgrind`
//! adds instructions per call.

fn main() {
    let callgrind = std::env::args().any(|a| a == "--callgrind");
    if std::env::args().any(|a| a == "--quiet") {
        // A callgrind child: run one configuration.
        ftrace_ops::main_entry();
        return;
    }
    ftrace_ops::bench::run(1_000_000, callgrind);
}
