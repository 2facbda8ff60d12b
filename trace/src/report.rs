//! `ftramp report`: a per-function table of a trace.
//!
//! For each function (over the selected threads and processes: one row per symbol and
//! module, so C++ overloads, which share their name without parameters, get a row each, named
//! with their parameters; a function of the same module in several processes is one row):
//! - **calls**: entries recorded (unfinished calls included);
//! - **total**: time inside the function; a recursive call nested in another call of the
//!   same function is not added again, so total never exceeds the wall time spent;
//! - **self**: total minus the time of direct children (summed over all calls);
//! - **average** and **maximum**: of each call's own duration (entry to exit).
//!
//! Times count the calls that ended: returned, unwound, or still running when their process
//! image ended (`exit()` called inside them, a fatal signal, `exec`), until then. Calls
//! without a known end (the thread exited inside them, the image was killed unseen) count
//! as calls only, as every call of a `function` tracer trace does.

use crate::calls::{Step, Walk};
use crate::read::{Thread, Trace};
use crate::replay::{fmt_duration, Select};
use std::collections::HashMap;
use std::io::{self, Write};

/// Per-function figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FuncStats {
    pub name: String,
    pub calls: u64,
    /// Calls that ended (have a duration).
    pub ended: u64,
    pub total_ns: u64,
    pub self_ns: u64,
    /// Sum of each ended call's duration (recursion counted at every level).
    pub sum_ns: u64,
    pub max_ns: u64,
}

impl FuncStats {
    pub fn avg_ns(&self) -> Option<u64> {
        (self.ended > 0).then(|| self.sum_ns / self.ended)
    }
}

/// Column to sort by (descending; `Name` ascending).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    #[default]
    Total,
    SelfTime,
    Calls,
    Avg,
    Max,
    Name,
}

impl SortKey {
    pub const NAMES: [&'static str; 6] = ["total", "self", "calls", "avg", "max", "name"];

    pub fn parse(s: &str) -> Result<SortKey, String> {
        Ok(match s {
            "total" => SortKey::Total,
            "self" => SortKey::SelfTime,
            "calls" => SortKey::Calls,
            "avg" | "average" => SortKey::Avg,
            "max" | "maximum" => SortKey::Max,
            "name" | "func" | "function" => SortKey::Name,
            _ => {
                return Err(format!(
                    "unknown sort key {s:?} (known: {})",
                    SortKey::NAMES.join(", ")
                ))
            }
        })
    }
}

/// A row of the table: how it may be named.
struct Row {
    /// The name without parameters ([`Process::func_name`](crate::read::Process::func_name)).
    short: String,
    /// The raw symbol (`short` when there is none), demangled with its parameters only
    /// for overloads that share `short`.
    raw: String,
    module: String,
}

/// Figures of every function called in the selected threads, unsorted.
///
/// A row is a function: its raw symbol name and module (calls of one function from
/// several processes add up).  Recursion is recognised per row, so a row's total never
/// exceeds the time spent in it; until the twenty-third session rows were merged by the
/// name without parameters after the figures were made, and `f(const char*)` calling
/// `f(int)` counted the inner calls' time twice.
pub fn stats(trace: &Trace, select: &Select) -> Vec<FuncStats> {
    let has_exits = trace.info.has_exits();
    let mut keys: HashMap<(String, String), u32> = HashMap::new();
    let mut rows: Vec<Row> = Vec::new();
    // Per row: its figures and how many of its calls are open.
    let mut by_row: Vec<(FuncStats, u32)> = Vec::new();
    for p in trace.processes.iter().filter(|p| select.process(p)) {
        let mut id_row: HashMap<u32, u32> = HashMap::new();
        let mut row_of = |id: u32| {
            *id_row.entry(id).or_insert_with(|| {
                let (raw, module) = match p.symbol(id) {
                    Some(s) if s.name != "?" && !s.name.is_empty() => (s.name.clone(), s.module.clone()),
                    _ => (p.func_name(id), String::new()),
                };
                let next = rows.len() as u32;
                *keys.entry((raw.clone(), module.clone())).or_insert_with(|| {
                    rows.push(Row { short: p.func_name(id), raw, module });
                    next
                })
            })
        };
        for t in p.threads.iter().filter(|t| select.thread(t)) {
            thread_stats(t, has_exits, &mut row_of, &mut by_row);
        }
    }
    let names = row_names(&rows);
    by_row
        .into_iter()
        .zip(names)
        .map(|((mut s, _), name)| {
            s.name = name;
            s
        })
        .collect()
}

/// Each row's name: without parameters where that is unique, else with them, else
/// followed by its module's file name, else by what sets its Rust symbol apart (the crate
/// that instantiated it: `<alloc::raw_vec::RawVecInner>::finish_grow [rg] (crate textwrap)`,
/// or the hash of a legacy symbol), else by a number (`#1`, `#2`, in the order of the raw
/// symbols and modules).  Until the twenty-eighth session the copies of one Rust function
/// in several crates read the same (7 rows of `…::finish_grow [rg]` for ripgrep; test
/// `report_tells_apart_copies_of_one_function`).
fn row_names(rows: &[Row]) -> Vec<String> {
    let count = |names: &[String]| {
        let mut n: HashMap<&str, usize> = HashMap::new();
        for name in names {
            *n.entry(name.as_str()).or_default() += 1;
        }
        names.iter().map(|name| n[name.as_str()]).collect::<Vec<usize>>()
    };
    let mut names: Vec<String> = rows.iter().map(|r| r.short.clone()).collect();
    let shared = count(&names);
    for (i, r) in rows.iter().enumerate() {
        if shared[i] > 1 {
            if let Some(full) = crate::read::demangle_with_params(&r.raw) {
                names[i] = full;
            }
        }
    }
    let shared = count(&names);
    for (i, r) in rows.iter().enumerate() {
        if shared[i] > 1 && !r.module.is_empty() {
            let file = r.module.rsplit('/').next().unwrap_or(&r.module);
            names[i] = format!("{} [{file}]", names[i]);
        }
    }
    let shared = count(&names);
    for (i, r) in rows.iter().enumerate() {
        if shared[i] > 1 {
            if let Some(tag) = ftramp_demangle::rust_instance(&r.raw) {
                names[i] = format!("{} ({tag})", names[i]);
            }
        }
    }
    let shared = count(&names);
    let mut alike: Vec<usize> = (0..rows.len()).filter(|&i| shared[i] > 1).collect();
    alike.sort_by(|&a, &b| (&names[a], &rows[a].raw, &rows[a].module).cmp(&(&names[b], &rows[b].raw, &rows[b].module)));
    let mut number = vec![0; rows.len()];
    for (k, &i) in alike.iter().enumerate() {
        number[i] = if k > 0 && names[alike[k - 1]] == names[i] { number[alike[k - 1]] + 1 } else { 1 };
    }
    for &i in &alike {
        names[i] = format!("{} #{}", names[i], number[i]);
    }
    names
}

/// Adds one thread's calls to `by_row`, indexed by `row_of` of the function
/// (with, per row, how many of its calls are open): one [`Walk`] over the events, holding per open call only
/// the time of its direct children that ended and whether it is nested in
/// another call of its function (`report` of a 20 M-event trace took 1.6 GB
/// with the call tree).
fn thread_stats(t: &Thread, has_exits: bool, row_of: &mut impl FnMut(u32) -> u32, by_row: &mut Vec<(FuncStats, u32)>) {
    // Per open call: (children's time, nested).
    let mut open: Vec<(u64, bool)> = Vec::new();
    let mut row = |func: u32, by_row: &mut Vec<(FuncStats, u32)>| {
        let r = row_of(func) as usize;
        if r >= by_row.len() {
            by_row.resize(r + 1, Default::default());
        }
        r
    };
    Walk::thread(t, has_exits, |s| match s {
        Step::Enter { func, .. } => {
            let r = row(func, by_row);
            let (s, active) = &mut by_row[r];
            s.calls += 1;
            open.push((0, *active > 0));
            *active += 1;
        }
        Step::Leave { func, .. } => {
            let Some((children_ns, nested)) = open.pop() else {
                return;
            };
            let r = row(func, by_row);
            let (st, active) = &mut by_row[r];
            *active -= 1;
            // Unfinished calls (no known end) and entries-only ones are counted, without
            // a time.
            let Some(d) = s.duration() else { return };
            st.ended += 1;
            st.sum_ns = st.sum_ns.saturating_add(d);
            st.max_ns = st.max_ns.max(d);
            if !nested {
                st.total_ns = st.total_ns.saturating_add(d);
            }
            st.self_ns = st.self_ns.saturating_add(d.saturating_sub(children_ns));
            if let Some(parent) = open.last_mut() {
                parent.0 = parent.0.saturating_add(d);
            }
        }
        Step::Lost { .. } => {}
    });
}

/// Sorts `rows` by `key` (ties by name).
pub fn sort(rows: &mut [FuncStats], key: SortKey) {
    rows.sort_by(|a, b| {
        let k = |s: &FuncStats| match key {
            SortKey::Total => s.total_ns,
            SortKey::SelfTime => s.self_ns,
            SortKey::Calls => s.calls,
            SortKey::Avg => s.avg_ns().unwrap_or(0),
            SortKey::Max => s.max_ns,
            SortKey::Name => 0,
        };
        k(b).cmp(&k(a)).then_with(|| a.name.cmp(&b.name))
    });
}

/// What `report` shows.
#[derive(Debug, Clone, Default)]
pub struct ReportOptions {
    pub select: Select,
    pub sort: SortKey,
    /// Only the first N rows.
    pub limit: Option<usize>,
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// Writes the table.
pub fn report(trace: &Trace, opts: &ReportOptions, out: &mut dyn Write) -> io::Result<()> {
    let mut rows = stats(trace, &opts.select);
    // A function-tracer trace has no times: sort by calls instead.
    let by = match opts.sort {
        SortKey::Total | SortKey::SelfTime | SortKey::Avg | SortKey::Max
            if !trace.info.has_exits() =>
        {
            SortKey::Calls
        }
        k => k,
    };
    sort(&mut rows, by);
    let threads = opts.select.threads(trace).count();
    let processes = trace
        .processes
        .iter()
        .filter(|p| opts.select.process(p))
        .count();
    let key = SortKey::NAMES[by as usize];
    let tracer = if trace.info.tracer.is_empty() {
        "function_graph?"
    } else {
        trace.info.tracer.as_str()
    };
    writeln!(
        out,
        "# ftramp report: {} ({tracer}): {}, {}, {}; sorted by {key}",
        trace.dir.display(),
        plural(processes, "process image"),
        plural(threads, "thread"),
        plural(rows.len(), "function")
    )?;
    // Times next to losses are the times of what is left: an EXIT whose
    // ENTRY was lost closes an outer call early, a lost EXIT leaves a call
    // open until an outer one returns.
    let lost: u64 = trace.processes.iter().filter(|p| opts.select.process(p)).map(|p| p.lost).fold(0, u64::saturating_add);
    if lost > 0 {
        writeln!(out, "# {lost} events lost in these process images: the times of calls around the losses may be wrong")?;
    }
    writeln!(out, "#")?;
    writeln!(
        out,
        "  Total time   Self time       Calls     Average     Maximum  Function"
    )?;
    writeln!(
        out,
        "  ==========  ==========  ==========  ==========  ==========  ===================="
    )?;
    let t = |ended: u64, ns: Option<u64>| match ns {
        Some(ns) if ended > 0 => fmt_duration(ns),
        _ => format!("{:>10}", "-"),
    };
    for s in rows.iter().take(opts.limit.unwrap_or(usize::MAX)) {
        writeln!(
            out,
            "  {}  {}  {:>10}  {}  {}  {}",
            t(s.ended, Some(s.total_ns)),
            t(s.ended, Some(s.self_ns)),
            s.calls,
            t(s.ended, s.avg_ns()),
            t(s.ended, Some(s.max_ns)),
            s.name
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::CallTree;

    /// The figures as the call tree gives them (what `stats` computed
    /// before its one-pass version): the oracle for [`thread_stats`].
    fn tree_stats(t: &Thread, has_exits: bool) -> HashMap<u32, FuncStats> {
        let tree = CallTree::build(t, has_exits);
        let mut by_id: HashMap<u32, FuncStats> = HashMap::new();
        let mut chain: Vec<usize> = Vec::new();
        let mut active: HashMap<u32, u32> = HashMap::new();
        for (c, parent) in tree.preorder() {
            while chain.last().is_some_and(|&top| Some(top) != parent) {
                if let Some(top) = chain.pop() {
                    *active.get_mut(&tree.calls[top].func).unwrap() -= 1;
                }
            }
            let call = &tree.calls[c];
            let nested = active.get(&call.func).copied().unwrap_or(0) > 0;
            let s = by_id.entry(call.func).or_default();
            s.calls += 1;
            if let Some(d) = call.duration() {
                s.ended += 1;
                s.sum_ns = s.sum_ns.saturating_add(d);
                s.max_ns = s.max_ns.max(d);
                if !nested {
                    s.total_ns = s.total_ns.saturating_add(d);
                }
                s.self_ns = s.self_ns.saturating_add(tree.self_ns(c).unwrap_or(0));
            }
            chain.push(c);
            *active.entry(call.func).or_default() += 1;
        }
        by_id
    }

    /// Random threads — recursion, UNWOUND markers, EXITs of calls further
    /// out (longjmp), EXITs with nothing open, calls left unfinished — give
    /// the call tree's figures in one pass.
    #[test]
    fn one_pass_figures_are_the_call_trees() {
        let mut r = crate::testgen::Rng::new(0x2545_f491_4f6c_dd1d);
        let shape = crate::testgen::Shape { events: 200, funcs: 5, step_ns: 1000, loss_every: 0 };
        for round in 0..300 {
            let t = crate::testgen::thread(&mut r, 1, &shape);
            for has_exits in [true, false] {
                // Rows numbered in the order functions are met, mapped back to ids.
                let mut ids: Vec<u32> = Vec::new();
                let mut got = Vec::new();
                thread_stats(&t, has_exits, &mut |id| ids.iter().position(|&i| i == id).unwrap_or_else(|| { ids.push(id); ids.len() - 1 }) as u32, &mut got);
                let got: HashMap<u32, FuncStats> = got
                    .into_iter()
                    .enumerate()
                    .map(|(row, (s, active))| {
                        assert_eq!(active, 0, "round {round}: open counts return to 0");
                        (ids[row], s)
                    })
                    .collect();
                let want = tree_stats(&t, has_exits);
                assert_eq!(
                    got, want,
                    "round {round}, has_exits {has_exits}: {:?}",
                    t.events
                );
            }
        }
    }

    #[test]
    fn sort_keys() {
        for (i, n) in SortKey::NAMES.iter().enumerate() {
            assert_eq!(SortKey::parse(n).map(|k| k as usize), Ok(i));
        }
        assert!(SortKey::parse("speed").unwrap_err().contains("total, self"));
    }
}
