//! Two fgraph users at once: see the library docs.

fn main() {
    fgraph_multi::main_entry()
}
