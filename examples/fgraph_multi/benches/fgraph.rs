//! `cargo bench -p fgraph-multi`: fgraph entry only, entry+exit with and
//! without timestamps, and XRay's no-op handler, side by side.
//! `cargo bench -p fgraph-multi -- --callgrind` adds instructions per call.

fn main() {
    let callgrind = std::env::args().any(|a| a == "--callgrind");
    if std::env::args().any(|a| a == "--quiet") {
        // A callgrind child: run one configuration.
        fgraph_multi::main_entry();
        return;
    }
    fgraph_multi::bench::run(2_000_000, callgrind);
}
