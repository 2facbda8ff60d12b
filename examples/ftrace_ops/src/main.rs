//! Linux's `samples/ftrace/ftrace-ops.c` on ftramp: see the library docs.

fn main() {
    ftrace_ops::main_entry()
}
