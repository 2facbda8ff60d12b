//! Site discovery on the running test binary and on libraries it opens
//! and closes (tests/c/sites/, built by build.rs with the arch's site
//! flags).  Runs natively on x86_64 and, cross-built, under qemu-user.
//!
//! Every test holds `LOCK`: some rewrite sites, and no other test may run
//! or read a site meanwhile.
//!
//! Compiled where the arch's site flags record sites in a table (not on
//! ppc64le, whose `-pg -mprofile-kernel` sites are recorded nowhere).
#![cfg(ftramp_sites)]

use ftramp_exectest::*;
use ftramp_runtime::sites::{self, RefuseReason, SiteKind, SkipReason, SymbolSource};
use ftramp_runtime::{discover, host_spec, patch, Discovery};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};

extern "C" {
    fn sites_victim(a: i64) -> i64;
    fn sites_neighbour(a: i64) -> i64;
    fn sites_pad(a: i64) -> i64;
    fn sites_pad_callsite(a: i64) -> i64;
    fn sites_victim_callsite(a: i64) -> i64;
}

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A function's address.
macro_rules! addr {
    ($f:expr) => {
        $f as *const () as usize
    };
}

/// A landing pad's size (`endbr64`, `bti c`) where build.rs enables them.
fn pad_len() -> usize {
    match ftramp_runtime::HOST_ARCH {
        "x86_64" | "aarch64" => 4,
        _ => 0,
    }
}

fn is_nop(bytes: &[u8]) -> bool {
    host_spec().nops.iter().any(|n| n == bytes)
}

#[test]
fn finds_tracees_by_symbol() {
    let _g = lock();
    let d = discover().unwrap();
    let main = d.modules().iter().find(|m| m.is_main).expect("the main program is a module");
    let tracees = [
        ("tracee_args", addr!(tracee_args)),
        ("tracee_args_alt", addr!(tracee_args_alt)),
        ("tracee_fp", addr!(tracee_fp)),
        ("tracee_two", addr!(tracee_two)),
        ("tracee_nested", addr!(tracee_nested)),
        ("sites_neighbour", addr!(sites_neighbour)),
    ];
    for (name, f) in tracees {
        let found: Vec<_> = d.sites_named(name).collect();
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        let site = found[0];
        assert_eq!(site.addr, f, "{name}");
        assert_eq!(site.record, f, "{name}");
        assert_eq!((site.offset_in_symbol, site.pre_entry), (0, 0), "{name}");
        assert_eq!(site.kind, SiteKind::PatchableEntry);
        assert_eq!(site.module, main.id);
        assert!(main.text.iter().any(|r| r.contains(&f)));
        assert_eq!(d.site_at(f), Some(site));
        assert!(is_nop(&patch::read_text(f, host_spec().site_len)));
        assert_eq!(site.to_string(), format!("{f:#x} <{name}>"));
    }
    assert_eq!(main.symbols, SymbolSource::Symtab);
    // Functions without the flags (Rust code, libc) are no sites.
    assert!(d.site_at(addr!(finds_tracees_by_symbol)).is_none());
    assert!(d.site_at(addr!(libc::getpid)).is_none());
    // Every other loaded object was read or skipped with a reason.
    assert!(d.modules().iter().any(|m| m.name.contains("libc.so")), "{:?}", d.modules());
    for s in d.skipped() {
        assert!(!s.reason.to_string().is_empty());
    }
}

#[test]
fn callsite_sites_reserve_the_ops_word() {
    let _g = lock();
    let d = discover().unwrap();
    let f = addr!(tracee_callsite);
    let site = d.site_at(f).expect("tracee_callsite is a site");
    assert_eq!(site.symbol.as_deref(), Some("tracee_callsite"));
    assert_eq!((site.record, site.pre_entry, site.offset_in_symbol), (f - 8, 8, 0));
    assert_eq!(site.pre_entry_range(), f - 8..f);
    assert_eq!(site.callsite_word(host_spec()), Some(f - 8));
}

#[test]
fn landing_pads_come_before_the_site() {
    let _g = lock();
    let d = discover().unwrap();
    let pad = pad_len();
    // M = 0: the compiler records the NOPs after the pad.
    let f = addr!(sites_pad);
    let site = d.sites_named("sites_pad").next().expect("sites_pad is a site");
    assert_eq!((site.addr, site.record, site.offset_in_symbol, site.pre_entry), (f + pad, f + pad, pad, 0));
    // M > 0: recorded before the symbol, the site after the pad; the
    // spec's ops word offset would overlap the pad, so no callsite word.
    let f = addr!(sites_pad_callsite);
    let site = d.sites_named("sites_pad_callsite").next().expect("sites_pad_callsite is a site");
    assert_eq!((site.addr, site.record, site.offset_in_symbol, site.pre_entry), (f + pad, f - 8, pad, 8));
    if pad > 0 {
        assert_eq!(site.callsite_word(host_spec()), None);
    }
    // SAFETY: plain C functions; the sites are NOPs.
    unsafe {
        assert_eq!(sites_pad(1), 12);
        assert_eq!(sites_pad_callsite(1), 14);
    }
}

#[test]
fn a_site_that_is_not_a_nop_is_refused() {
    let _g = lock();
    let spec = host_spec();
    let f = addr!(sites_victim);
    assert!(discover().unwrap().site_at(f).is_some(), "the victim starts as a site");
    // Overwrite its NOPs (never called again) with other bytes.
    let garbage: Vec<u8> = spec.nops[0].iter().map(|b| !b).collect();
    assert!(!is_nop(&garbage));
    patch::write_text(f, &garbage).unwrap();

    let d = discover().unwrap();
    assert!(d.site_at(f).is_none(), "a non-NOP site is never returned as patchable");
    let refused: Vec<_> = d.refused().filter(|r| r.addr == f).collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    let r = refused[0];
    assert_eq!(r.symbol.as_deref(), Some("sites_victim"));
    assert_eq!(r.found, garbage);
    assert_eq!(r.reason, RefuseReason::NotNop);
    assert_eq!(r.kind, SiteKind::PatchableEntry);
    let text = r.to_string();
    assert!(text.starts_with(&format!("{f:#x} <sites_victim>: not a NOP form")), "{text}");
    assert!(text.contains(&format!("found [{:02x}", garbage[0])), "{text}");
    // Its neighbour is unaffected.
    assert!(d.site_at(addr!(sites_neighbour)).is_some());
    // SAFETY: plain C function with a NOP site.
    assert_eq!(unsafe { sites_neighbour(2) }, 12);
}

#[test]
fn reserved_bytes_that_are_not_nops_are_refused() {
    let _g = lock();
    let (f, pad) = (addr!(sites_victim_callsite), pad_len());
    assert!(discover().unwrap().site_at(f + pad).is_some(), "the victim starts as a site");
    // Overwrite the 8 reserved bytes before the symbol (never executed).
    let garbage = [0xffu8; 8];
    patch::write_text(f - 8, &garbage).unwrap();
    let d = discover().unwrap();
    assert!(d.site_at(f + pad).is_none());
    let r = d.refused().find(|r| r.addr == f + pad).expect("refused");
    assert_eq!(r.reason, RefuseReason::PreEntryNotNop);
    assert_eq!((r.symbol.as_deref(), r.offset_in_symbol), (Some("sites_victim_callsite"), pad));
    assert_eq!(r.found, garbage);
    // SAFETY: the function's own NOPs are intact.
    assert_eq!(unsafe { sites_victim_callsite(1) }, 18);
}

fn mapped(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().any(|l| l.ends_with(path))
}

#[test]
fn dlopen_and_dlclose() {
    let _g = lock();
    let path = env!("FTRAMP_SITES_DL_SO");
    let mut d = discover().unwrap();
    assert!(d.modules().iter().all(|m| m.name != path));

    let lib = Lib::open(path);
    let changes = d.refresh().unwrap();
    assert_eq!(changes.removed.len(), 0);
    let m = d.modules().iter().find(|m| m.name == path).expect("the library is picked up");
    assert!(changes.added.contains(&m.id));
    assert_eq!(m.symbols, SymbolSource::Symtab);
    let tracee = lib.sym("sites_dl_tracee");
    let site = d.site_at(tracee).expect("sites_dl_tracee is a site");
    assert_eq!((site.symbol.as_deref(), site.module, site.record), (Some("sites_dl_tracee"), m.id, tracee));
    assert!(d.site_at(lib.sym("sites_dl_other")).is_some());
    let names: Vec<_> = m.sites.iter().filter_map(|s| s.symbol.as_deref()).collect();
    assert!(names.contains(&"sites_dl_static"), "{names:?}");
    assert!(m.refused.is_empty(), "{:?}", m.refused);
    assert_eq!(lib.call("sites_dl_other", 2), 18);
    let id = m.id;
    // A second refresh reads nothing again.
    let again = d.refresh().unwrap();
    assert!(again.added.is_empty() && again.removed.is_empty());

    lib.close();
    assert!(!mapped(path), "dlclose unmapped the library");
    // Stale until refreshed, but never touched: while_loaded skips it.
    assert!(d.module(id).is_some());
    d.while_loaded(|live| assert!(live.iter().all(|m| m.id != id)));
    let changes = d.refresh().unwrap();
    assert_eq!(changes.removed.iter().map(|m| m.id).collect::<Vec<_>>(), vec![id]);
    assert!(changes.unloaded >= 1);
    assert!(d.module(id).is_none());
    assert!(d.site_at(tracee).is_none());
    assert_eq!(d.sites_named("sites_dl_tracee").count(), 0);

    // Opened again (likely at the same address): a new module.
    let lib = Lib::open(path);
    let changes = d.refresh().unwrap();
    let m = d.modules().iter().find(|m| m.name == path).expect("picked up again");
    assert_ne!(m.id, id);
    assert_eq!(changes.added, vec![m.id]);
    assert!(d.site_at(lib.sym("sites_dl_tracee")).is_some());
    assert_eq!(lib.call("sites_dl_tracee", 1), 10);
    lib.close();
    d.refresh().unwrap();
    assert!(d.modules().iter().all(|m| m.name != path));
}

#[test]
fn refresh_races_with_dlopen_and_dlclose() {
    let _g = lock();
    let path = env!("FTRAMP_SITES_DL_SO");
    let refreshes = if cfg!(target_arch = "x86_64") { 300 } else { 40 };
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let t = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut rounds = 0;
            while !stop.load(SeqCst) {
                let lib = Lib::open(path);
                assert_eq!(lib.call("sites_dl_tracee", 1), 10);
                lib.close();
                rounds += 1;
            }
            rounds
        }
    });
    let mut d = discover().unwrap();
    let (mut seen, mut skipped) = (0, Vec::new());
    for _ in 0..refreshes {
        d.refresh().unwrap();
        if let Some(m) = d.modules().iter().find(|m| m.name == path) {
            // Whenever the library is read, it is read whole.
            assert_eq!((m.sites.len(), m.refused.len()), (3, 0), "{m:?}");
            seen += 1;
        }
        skipped.extend(d.skipped().iter().filter(|s| s.name == path).map(|s| s.reason.to_string()));
    }
    stop.store(true, SeqCst);
    let rounds = t.join().unwrap();
    d.refresh().unwrap();
    assert!(d.modules().iter().all(|m| m.name != path));
    eprintln!("{refreshes} refreshes during {rounds} dlopen/dlclose rounds; library read in {seen}, skipped: {skipped:?}");
}

/// A private copy of a test library, so it can be deleted or replaced
/// while loaded.
fn copy_lib(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Replaces `path` by a new file (a new inode: the loaded mapping keeps
/// the old one, as when a package upgrade replaces a library).
fn replace_file(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn odd_files_are_skipped_with_a_reason() {
    let _g = lock();
    let dir = std::env::temp_dir().join(format!("ftramp-sites-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let orig = std::fs::read(env!("FTRAMP_SITES_DL_SO")).unwrap();

    // Stripped: sites named from .dynsym; the static function's is unnamed.
    let stripped_path = env!("FTRAMP_SITES_DL_STRIPPED_SO");
    let stripped = Lib::open(stripped_path);
    // No section headers (e_shoff, e_shnum, e_shstrndx zeroed): the loader
    // does not need them.
    let mut bytes = orig.clone();
    bytes[0x28..0x30].fill(0);
    bytes[0x3c..0x40].fill(0);
    let noshdr_path = copy_lib(&dir, "noshdr.so", &bytes);
    let noshdr = Lib::open(&noshdr_path);
    // Deleted after loading.
    let deleted_path = copy_lib(&dir, "deleted.so", &orig);
    let deleted = Lib::open(&deleted_path);
    std::fs::remove_file(&deleted_path).unwrap();
    // Replaced after loading by an ELF file whose first PT_LOAD differs.
    let replaced_path = copy_lib(&dir, "replaced.so", &orig);
    let replaced = Lib::open(&replaced_path);
    let mut bytes = orig.clone();
    let word = |b: &[u8], at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
    let phoff = word(&bytes, 0x20) as usize;
    let load = (0..).map(|i| phoff + 56 * i).find(|&p| bytes[p..p + 4] == 1u32.to_ne_bytes()).unwrap();
    let memsz = word(&bytes, load + 40) + 0x10;
    bytes[load + 40..load + 48].copy_from_slice(&memsz.to_ne_bytes());
    replace_file(&replaced_path, &bytes);
    // Replaced after loading by something that is not ELF.
    let garbage_path = copy_lib(&dir, "garbage.so", &orig);
    let garbage = Lib::open(&garbage_path);
    replace_file(&garbage_path, b"not an ELF file");

    let d = discover().unwrap();
    let m = d.modules().iter().find(|m| m.name == stripped_path).expect("stripped library read");
    assert_eq!(m.symbols, SymbolSource::Dynsym);
    assert_eq!(m.sites.len(), 3, "{m:?}");
    assert_eq!(d.site_at(stripped.sym("sites_dl_tracee")).unwrap().symbol.as_deref(), Some("sites_dl_tracee"));
    assert_eq!(m.sites.iter().filter(|s| s.symbol.is_none()).count(), 1, "{:?}", m.sites);
    let reason = |p: &Path| d.skipped().iter().find(|s| Path::new(&s.name) == p).map(|s| s.reason.clone());
    assert_eq!(reason(&noshdr_path), Some(SkipReason::NoSectionHeaders));
    assert!(matches!(reason(&deleted_path), Some(SkipReason::Open(_))), "{:?}", reason(&deleted_path));
    assert_eq!(reason(&replaced_path), Some(SkipReason::Mismatch));
    assert!(matches!(reason(&garbage_path), Some(SkipReason::NotElf(_))), "{:?}", reason(&garbage_path));
    // None of them lost a site it should have had: they are only skipped.
    for p in [&noshdr_path, &deleted_path, &replaced_path, &garbage_path] {
        assert!(d.modules().iter().all(|m| Path::new(&m.name) != p.as_path()));
    }
    for lib in [stripped, noshdr, deleted, replaced, garbage] {
        assert_eq!(lib.call("sites_dl_tracee", 2), 17);
        lib.close();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(target_arch = "x86_64")]
#[test]
fn mcount_loc_sites() {
    let _g = lock();
    let path = env!("FTRAMP_SITES_MCOUNT_SO");
    let lib = Lib::open(path);
    let d = discover().unwrap();
    let m = d.modules().iter().find(|m| m.name == path).expect("the mcount library is read");
    for name in ["sites_mcount_tracee", "sites_mcount_other"] {
        let f = lib.sym(name);
        let site = d.site_at(f).unwrap_or_else(|| panic!("{name} is a site: {:?}", m.refused));
        assert_eq!((site.kind, site.symbol.as_deref(), site.module), (SiteKind::McountLoc, Some(name), m.id));
        assert_eq!(patch::read_text(f, 5), [0x0f, 0x1f, 0x44, 0x00, 0x00]);
    }
    assert_eq!(lib.call("sites_mcount_other", 1), 9);
    lib.close();
}

#[test]
fn optimize_nops_rewrites_to_the_cheapest_form() {
    let _g = lock();
    let d = discover().unwrap();
    let total = d.sites().count();
    let f = addr!(tracee_two);
    let before = patch::read_text(f, host_spec().site_len);
    let stats = sites::optimize_nops(&d).unwrap();
    assert_eq!(stats.rewritten + stats.unchanged, total);
    let after = patch::read_text(f, host_spec().site_len);
    if ftramp_runtime::HOST_ARCH == "x86_64" {
        // gcc's five one-byte NOPs became one 5-byte NOP (unless a previous
        // run in this process already did it).
        assert_eq!(after, [0x0f, 0x1f, 0x44, 0x00, 0x00]);
        assert!(before == [0x90; 5] && stats.rewritten > 0 || before == after);
    } else {
        assert_eq!((stats.rewritten, after), (0, before));
    }
    // SAFETY: plain C function whose site holds a NOP form.
    assert_eq!(tracee_two(1, 2), 1002);
    // The rewritten sites are still discovered, and nothing is left to do.
    let d: Discovery = discover().unwrap();
    assert!(d.site_at(f).is_some());
    assert_eq!(d.sites().count(), total);
    assert_eq!(sites::optimize_nops(&d).unwrap().rewritten, 0);
}

#[test]
fn optimize_nops_while_threads_run_the_sites() {
    let _g = lock();
    // A fresh copy of the library: its sites hold the compiler's NOPs.
    let path = env!("FTRAMP_SITES_DL_SO");
    let lib = Lib::open(path);
    let (tracee, other) = (lib.sym("sites_dl_tracee"), lib.sym("sites_dl_other"));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..3)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                type F = extern "C" fn(i64) -> i64;
                // SAFETY: both take and return a long; the library stays
                // open until the threads are joined.
                let (t, o) = unsafe { (std::mem::transmute::<usize, F>(tracee), std::mem::transmute::<usize, F>(other)) };
                let mut calls = 0u64;
                while !stop.load(SeqCst) {
                    assert_eq!(t(i), i * 7 + 3);
                    assert_eq!(o(i), i * 7 + 4);
                    calls += 1;
                }
                calls
            })
        })
        .collect();
    let d = discover().unwrap();
    let m = d.modules().iter().find(|m| m.name == path).unwrap();
    let before: Vec<Vec<u8>> = m.sites.iter().map(|s| patch::read_text(s.addr, host_spec().site_len)).collect();
    let stats = sites::optimize_nops(&d).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(true, SeqCst);
    let calls: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    for (s, old) in m.sites.iter().zip(&before) {
        let now = patch::read_text(s.addr, host_spec().site_len);
        assert!(is_nop(&now));
        if ftramp_runtime::HOST_ARCH == "x86_64" {
            assert_eq!((old.as_slice(), now.as_slice()), (&[0x90u8; 5][..], &[0x0f, 0x1f, 0x44, 0x00, 0x00][..]));
        }
    }
    if ftramp_runtime::HOST_ARCH == "x86_64" {
        assert!(stats.rewritten >= m.sites.len(), "{stats:?}");
    }
    assert!(calls > 0);
    lib.close();
}

#[test]
fn batch_patch_skips_sites_whose_bytes_differ() {
    let _g = lock();
    let spec = host_spec();
    let (a, b) = (addr!(tracee_fp), addr!(tracee_nested));
    let (old_a, old_b) = (patch::read_text(a, spec.site_len), patch::read_text(b, spec.site_len));
    let wrong: Vec<u8> = old_b.iter().map(|x| !x).collect();
    // Rewrite a's NOP into itself (the bytes match) and try b with the
    // wrong expected bytes.
    let edits = [
        patch::TextEdit { addr: a, expect: &old_a, new: &old_a },
        patch::TextEdit { addr: b, expect: &wrong, new: &spec.nops[0] },
    ];
    assert_eq!(patch::replace_text_batch(&edits).unwrap(), vec![b]);
    assert_eq!(patch::read_text(a, spec.site_len), old_a);
    assert_eq!(patch::read_text(b, spec.site_len), old_b);
    assert_eq!(patch::replace_text_batch(&[]).unwrap(), Vec::<usize>::new());
    // SAFETY: plain C function whose site holds a NOP form.
    assert_eq!(tracee_nested(3), expect_nested(3));
}


/// aarch64: a function of the SVE vector PCS (`STO_AARCH64_VARIANT_PCS`,
/// spec `site.refuse_st_other`) is refused, with its reason, and left
/// alone; the plain function beside it is a site.
#[cfg(target_arch = "aarch64")]
#[test]
fn sve_vector_pcs_functions_are_refused() {
    let _g = lock();
    let path = env!("FTRAMP_SITES_SVE_SO");
    let lib = Lib::open(path);
    let d = discover().unwrap();
    let m = d.modules().iter().find(|m| m.name == path).expect("the library is picked up");
    let sve = lib.sym("sites_sve_twice");
    assert!(d.site_at(sve).is_none(), "an SVE-PCS function is not a site");
    let r = m.refused.iter().find(|r| r.symbol.as_deref() == Some("sites_sve_twice")).expect("refused");
    assert_eq!(r.reason, RefuseReason::CallingConvention);
    assert!(r.to_string().contains("calling convention"), "{r}");
    assert!(d.site_at(lib.sym("sites_sve_plain")).is_some(), "the plain function is a site");
    assert_eq!(lib.call("sites_sve_plain", 4), 9);
    lib.close();
}
