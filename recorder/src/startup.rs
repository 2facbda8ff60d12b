//! What the loader needs to start an image under the recorder: room for
//! the initial-exec TLS of its libraries beside the audit module, and its
//! sanitizer runtime first among the preloaded libraries.
//!
//! Why the TLS room: with an `LD_AUDIT` module (`ftramp record`'s early
//! start), glibc sets TLS up before it loads the program's libraries, so
//! their initial-exec TLS (`DF_STATIC_TLS`) has to fit in the surplus it
//! keeps spare — about 1.8 KB, of which libc and the recorder take most.
//! A program whose libraries need more (ThreadSanitizer's runtime has
//! 768 KB, LSan's 56 KB) would not even start ("cannot
//! allocate memory in static TLS block").  The surplus is glibc's tunable
//! `glibc.rtld.optional_static_tls`: [`tunables`] raises it by what the
//! program's start-up libraries need, so such a program runs with the
//! module, and its libraries' constructors are recorded like any other's.
//!
//! Why the sanitizer order: ASan's and TSan's runtimes abort unless they
//! are the first library loaded, before any preloaded one
//! ([`preload_for`]).
//!
//! The CLI does both for the program it starts; the exec and
//! `posix_spawn` interposers for each image a recorded process starts,
//! since the variables are inherited and each program needs its own: a
//! shell running an ASan program, or an ASan program running `ls`.  The
//! recorder puts the user's own `GLIBC_TUNABLES` back in the environment at
//! start ([`restore_user_tunables`]), so the program sees what it would
//! untraced.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// Initial-exec TLS the libraries a program loads at start-up may have
/// without raising the surplus, in bytes: glibc keeps about 1.8 KB spare
/// with one audit module (libc takes 144 in each of two namespaces, the
/// recorder 592), and this leaves the rest as margin.
pub const ROOM: u64 = 512;

/// glibc's tunable for the surplus, and its default.
pub const TUNABLE: &str = "glibc.rtld.optional_static_tls";
const TUNABLE_DEFAULT: u64 = 512;

/// The variable holding the user's own `GLIBC_TUNABLES` while ours is set:
/// `-` when it was unset, else `=` and its value.
pub const ENV_USER_TUNABLES: &str = "FTRAMP_USER_TUNABLES";

/// What the loader reads from an object's dynamic section and program
/// headers.
struct Dynamic {
    /// The architecture.
    machine: object::Architecture,
    /// `DT_NEEDED` names.
    needed: Vec<String>,
    /// `DT_RUNPATH`/`DT_RPATH` directories (`$ORIGIN` replaced).
    runpath: Vec<PathBuf>,
    /// The `PT_TLS` size of an object marked `DF_STATIC_TLS` (its TLS is
    /// initial-exec: it must be in the static block).
    static_tls: Option<u64>,
    /// The object defines an allocator function (`malloc`, `calloc`,
    /// `realloc`, `free`) and has TLS that is not initial-exec: see
    /// [`dynamic_tls_allocator`].
    tls_allocator: bool,
}

/// The allocator functions that the loader calls by name.
const ALLOCATOR: [&str; 4] = ["malloc", "calloc", "realloc", "free"];

/// `path`'s [`Dynamic`]; `None` when it is not a 64-bit ELF file.  Reads
/// only the headers and the dynamic section.
fn dynamic(path: &Path) -> Option<Dynamic> {
    use object::read::elf::{Dyn, ElfFile64, FileHeader, ProgramHeader};
    use object::{elf, Endianness};
    let f = std::fs::File::open(path).ok()?;
    let data = object::ReadCache::new(f);
    let file = ElfFile64::<Endianness, _>::parse(&data).ok()?;
    let (header, endian) = (file.elf_header(), file.endian());
    let machine = object::Object::architecture(&file);
    let sections = header.sections(endian, &data).ok()?;
    let Some((entries, link)) = sections.dynamic(endian, &data).ok()? else {
        // A static program: nothing to load.
        return Some(Dynamic { machine, needed: Vec::new(), runpath: Vec::new(), static_tls: None, tls_allocator: false });
    };
    let strings = sections.strings(endian, &data, link).ok()?;
    let string = |d: &elf::Dyn64<Endianness>| d.string(endian, strings).ok().map(|n| String::from_utf8_lossy(n).into_owned());
    let origin = path.parent().unwrap_or(Path::new(".")).to_string_lossy();
    let static_tls = entries.iter().any(|d| d.d_tag(endian) == elf::DT_FLAGS && d.d_val(endian) & elf::DF_STATIC_TLS.0 != 0);
    let has_tls = header.program_headers(endian, &data).ok()?.iter().any(|p| p.p_type(endian) == elf::PT_TLS);
    let tls_allocator = has_tls && !static_tls && {
        use object::{Object, ObjectSymbol};
        file.dynamic_symbols().any(|s| s.is_definition() && s.name().is_ok_and(|n| ALLOCATOR.contains(&n)))
    };
    Some(Dynamic {
        tls_allocator,
        machine,
        // (A name with a slash is a path, where `$ORIGIN` counts too.)
        needed: entries.iter().filter(|d| d.d_tag(endian) == elf::DT_NEEDED).filter_map(string).map(|n| if n.contains('/') { expand_origin(&n, &origin) } else { n }).collect(),
        runpath: entries
            .iter()
            .filter(|d| matches!(d.d_tag(endian), elf::DT_RUNPATH | elf::DT_RPATH))
            .filter_map(string)
            .flat_map(|p| p.split(':').map(|d| PathBuf::from(expand_origin(d, &origin))).collect::<Vec<_>>())
            .collect(),
        static_tls: if static_tls {
            header.program_headers(endian, &data).ok()?.iter().find(|p| p.p_type(endian) == elf::PT_TLS).map(|p| p.p_memsz(endian))
        } else {
            None
        },
    })
}

/// `path`'s `DT_NEEDED` names (none when it is not a dynamically linked
/// 64-bit ELF file).
pub fn needed(path: &Path) -> Vec<String> {
    dynamic(path).map(|d| d.needed).unwrap_or_default()
}

/// The recorder library's file name.
pub const PRELOAD_NAME: &str = "libftramp_recorder.so";

/// The sanitizer runtimes `prog` links that must be the first libraries
/// loaded (`libasan.so.8`, …; their sonames, which the loader finds by
/// itself).
pub fn sanitizer_runtimes(prog: &Path) -> Vec<String> {
    needed(prog).into_iter().filter(|n| ["libasan.so", "libtsan.so", "libhwasan.so"].iter().any(|p| n.starts_with(p))).collect()
}

/// The `LD_PRELOAD` to start `prog` with, from the `current` one (which
/// has the recorder, `ftramp record`'s form: sanitizer runtimes, the
/// recorder, the user's preloads): `prog`'s own sanitizer runtimes in
/// place of those before the recorder.  `None` when `current` has no
/// recorder.
pub fn preload_for(prog: &Path, current: &OsStr) -> Option<std::ffi::OsString> {
    let entries: Vec<&OsStr> = preload_entries(current).collect();
    let ours = entries.iter().position(|e| is_recorder(e))?;
    let sanitizers = sanitizer_runtimes(prog).into_iter().map(std::ffi::OsString::from);
    let mut out = std::ffi::OsString::new();
    for (i, e) in sanitizers.chain(entries[ours..].iter().map(|e| e.to_os_string())).enumerate() {
        if i != 0 {
            out.push(" ");
        }
        out.push(e);
    }
    Some(out)
}

/// The recorder's own `LD_PRELOAD` entry, as the process started with it
/// ([`remember_recorder_entry`]): what an exec adds to an `LD_PRELOAD` the
/// program set itself.
static RECORDER_ENTRY: std::sync::OnceLock<std::ffi::OsString> = std::sync::OnceLock::new();

/// Keeps the recorder's entry of the `LD_PRELOAD` the process started
/// with, before the program can change the variable.
pub fn remember_recorder_entry() {
    if let Some(e) = ftramp_runtime::env::var_os("LD_PRELOAD").and_then(|v| preload_entries(&v).find(|e| is_recorder(e)).map(OsStr::to_os_string)) {
        let _ = RECORDER_ENTRY.set(e);
    }
}

/// `value` (an `LD_PRELOAD` a program set for the image it execs) with
/// the recorder put before its entries, as `ftramp record` orders them;
/// `None` when it has the recorder already (or the recorder's entry is
/// not known).  A program that sets its own preloads (git's test suite:
/// `LD_PRELOAD=libc_malloc_debug.so.0` before every test) had its
/// children run unrecorded, without a word.
pub fn with_recorder(value: &OsStr) -> Option<std::ffi::OsString> {
    if preload_entries(value).any(is_recorder) {
        return None;
    }
    let mut out = RECORDER_ENTRY.get()?.clone();
    for e in preload_entries(value) {
        out.push(" ");
        out.push(e);
    }
    Some(out)
}

/// The entries of an `LD_PRELOAD` value (separated by spaces or colons).
pub fn preload_entries(value: &OsStr) -> impl Iterator<Item = &OsStr> {
    use std::os::unix::ffi::OsStrExt;
    value.as_bytes().split(|&b| b == b' ' || b == b':').filter(|e| !e.is_empty()).map(OsStr::from_bytes)
}

/// Whether an `LD_PRELOAD` entry is the recorder library.
fn is_recorder(entry: &OsStr) -> bool {
    Path::new(entry).file_name() == Some(OsStr::new(PRELOAD_NAME))
}

/// The `GLIBC_TUNABLES` value to start `prog` with ([`tunables`]), given
/// the `LD_LIBRARY_PATH` and `LD_PRELOAD` it starts with (the recorder's
/// own TLS is counted in [`ROOM`]) and the value it would have untraced.
pub fn tunables_for(prog: &Path, ld_library_path: Option<&OsStr>, preload: Option<&OsStr>, user: Option<&OsStr>) -> Option<String> {
    let preloads: Vec<PathBuf> = preload.map(preload_entries).into_iter().flatten().filter(|e| !is_recorder(e)).map(PathBuf::from).collect();
    let need = need(prog, ld_library_path, &preloads).map_or(0, |(_, n)| n);
    tunables(user.map(|u| u.to_string_lossy()).as_deref(), need)
}

/// `s` with `$ORIGIN` (or `${ORIGIN}`) replaced by `origin`, the
/// directory of the object that names it.
fn expand_origin(s: &str, origin: &str) -> String {
    s.replace("${ORIGIN}", "$ORIGIN").replace("$ORIGIN", origin)
}

/// The loader's cache (`/etc/ld.so.cache`, glibc's format
/// `glibc-ld.so.cache1.1`): each library name with its path, in the
/// cache's order (a name can appear once per architecture).
fn ld_so_cache(file: &Path) -> Vec<(String, PathBuf)> {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    const HEADER: usize = 48;
    const ENTRY: usize = 24;
    let Ok(data) = std::fs::read(file) else { return Vec::new() };
    // The new format, alone or after the old one; string offsets count
    // from its header.
    let Some(base) = data.windows(MAGIC.len()).position(|w| w == MAGIC) else { return Vec::new() };
    let u32_at = |at: usize| data.get(at..at + 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap()) as usize);
    let string = |at: usize| {
        let s = data.get(base + at..)?;
        let end = s.iter().position(|&b| b == 0)?;
        Some(String::from_utf8_lossy(&s[..end]).into_owned())
    };
    let Some(n) = u32_at(base + MAGIC.len()) else { return Vec::new() };
    (0..n)
        .map_while(|i| {
            let e = base + HEADER + i * ENTRY;
            Some((string(u32_at(e + 4)?)?, PathBuf::from(string(u32_at(e + 8)?)?)))
        })
        .collect()
}

/// The initial-exec TLS of the libraries `prog` loads at start-up — the
/// `preloads` (paths or names), its `DT_NEEDED` closure, found as the loader finds them
/// (`DT_RUNPATH`/`DT_RPATH`, `ld_library_path`, the usual directories, the
/// loader's cache) — as the largest one's name and the total, in bytes;
/// `None` when none has any.
pub fn need(prog: &Path, ld_library_path: Option<&OsStr>, preloads: &[PathBuf]) -> Option<(String, u64)> {
    need_with_cache(prog, ld_library_path, preloads, Path::new("/etc/ld.so.cache"))
}

fn need_with_cache(prog: &Path, ld_library_path: Option<&OsStr>, preloads: &[PathBuf], cache_file: &Path) -> Option<(String, u64)> {
    let sizes: Vec<(String, u64)> = startup_libraries(prog, ld_library_path, preloads, cache_file)
        .into_iter()
        .filter_map(|(name, lib)| Some((name, lib.static_tls?)))
        .collect();
    let total: u64 = sizes.iter().map(|(_, s)| s).sum();
    let largest = sizes.into_iter().max_by_key(|(_, s)| *s)?;
    (total > 0).then_some((largest.0, total))
}

/// The first library `prog` loads at start-up (as [`need`] finds them)
/// that defines `malloc`, `calloc`, `realloc` or `free` and has TLS that is
/// not initial-exec (no `DF_STATIC_TLS`: any `__thread` of a `-fPIC`
/// library, unless marked `initial-exec`), by its name.  Beside an audit
/// module glibc gives such a library's TLS no room in the static block: it
/// allocates the block with `malloc` at each thread's first use, and when
/// that `malloc` is the library's own and touches its `__thread` data, the
/// allocation calls `malloc` again, for ever, until the stack overflows
/// (SIGSEGV before `main`; untraced, the program runs).  Such a program
/// must run without the module.  (The function cannot be seen to touch its
/// TLS: an allocator library with any non-initial-exec TLS counts.)
pub fn dynamic_tls_allocator(prog: &Path, ld_library_path: Option<&OsStr>, preload: Option<&OsStr>) -> Option<String> {
    let preloads: Vec<PathBuf> = preload.map(preload_entries).into_iter().flatten().filter(|e| !is_recorder(e)).map(PathBuf::from).collect();
    dynamic_tls_allocator_with_cache(prog, ld_library_path, &preloads, Path::new("/etc/ld.so.cache"))
}

fn dynamic_tls_allocator_with_cache(prog: &Path, ld_library_path: Option<&OsStr>, preloads: &[PathBuf], cache_file: &Path) -> Option<String> {
    startup_libraries(prog, ld_library_path, preloads, cache_file).into_iter().find(|(_, lib)| lib.tls_allocator).map(|(name, _)| name)
}

/// The libraries `prog` loads at start-up but libc, by file name, with
/// their [`Dynamic`]: the `preloads` and the `DT_NEEDED` closure, found
/// as the loader finds them.
fn startup_libraries(prog: &Path, ld_library_path: Option<&OsStr>, preloads: &[PathBuf], cache_file: &Path) -> Vec<(String, Dynamic)> {
    let Some(prog_dyn) = dynamic(prog) else { return Vec::new() };
    let machine = prog_dyn.machine;
    let mut search: Vec<PathBuf> = ld_library_path.iter().flat_map(std::env::split_paths).filter(|p| !p.as_os_str().is_empty()).collect();
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    search.extend(["/lib", "/usr/lib"].iter().map(|d| Path::new(d).join(&triple)));
    search.extend(["/lib64", "/usr/lib64", "/lib", "/usr/lib"].iter().map(PathBuf::from));
    let mut cache: Option<Vec<(String, PathBuf)>> = None;
    // A library of the program's architecture at `path`.
    let open = |path: &Path| dynamic(path).filter(|d| d.machine == machine);
    let mut seen = HashSet::new();
    let mut found: Vec<(String, Dynamic)> = Vec::new();
    // The preloads are looked for as the needed libraries are.
    let preloaded = Dynamic { machine, needed: preloads.iter().map(|p| p.to_string_lossy().into_owned()).collect(), runpath: Vec::new(), static_tls: None, tls_allocator: false };
    let mut queue = vec![prog_dyn, preloaded];
    while let Some(obj) = queue.pop() {
        for name in &obj.needed {
            // (libc's own initial-exec TLS is counted in the room.)
            if name.starts_with("libc.so") || !seen.insert(name.clone()) {
                continue;
            }
            let lib = if name.contains('/') {
                open(Path::new(&name))
            } else {
                obj.runpath.iter().chain(&search).find_map(|d| open(&d.join(name))).or_else(|| {
                    let cache = cache.get_or_insert_with(|| ld_so_cache(cache_file));
                    cache.iter().filter(|(n, _)| n == name).find_map(|(_, p)| open(p))
                })
            };
            if let Some(lib) = lib {
                let next = Dynamic { machine, needed: lib.needed.clone(), runpath: lib.runpath.clone(), static_tls: None, tls_allocator: false };
                found.push((name.rsplit('/').next().unwrap_or_default().to_string(), lib));
                queue.push(next);
            }
        }
    }
    found
}

/// The `GLIBC_TUNABLES` value for a program whose start-up libraries have
/// `need` bytes of initial-exec TLS, given the value it would have
/// untraced (`user`): that one when the need fits in [`ROOM`], else with
/// the surplus raised by the need (a larger surplus of the user's kept).
pub fn tunables(user: Option<&str>, need: u64) -> Option<String> {
    let user = user.filter(|u| !u.is_empty());
    if need <= ROOM {
        return user.map(str::to_owned);
    }
    let mut parts: Vec<&str> = user.map(|u| u.split(':').collect()).unwrap_or_default();
    let theirs = parts.iter().filter_map(|p| p.strip_prefix(TUNABLE)?.strip_prefix('=')?.parse::<u64>().ok()).max();
    parts.retain(|p| !p.starts_with(&format!("{TUNABLE}=")));
    let ours = (TUNABLE_DEFAULT + need).next_multiple_of(64);
    let value = format!("{TUNABLE}={}", theirs.map_or(ours, |t| t.max(ours)));
    parts.push(&value);
    Some(parts.join(":"))
}

/// `user` as [`ENV_USER_TUNABLES`] encodes it.
pub fn encode_user_tunables(user: Option<&OsStr>) -> std::ffi::OsString {
    match user {
        None => "-".into(),
        Some(u) => {
            let mut s = std::ffi::OsString::from("=");
            s.push(u);
            s
        }
    }
}

/// The user's own `GLIBC_TUNABLES` (`None`: unset) from its
/// [`ENV_USER_TUNABLES`] encoding.
pub fn decode_user_tunables(saved: &OsStr) -> Option<&OsStr> {
    use std::os::unix::ffi::OsStrExt;
    match saved.as_bytes() {
        [b'=', value @ ..] => Some(OsStr::from_bytes(value)),
        _ => None,
    }
}

/// Puts the user's own `GLIBC_TUNABLES` back when `ftramp record` (or the
/// exec interposers) set another for this image's start.  Before main,
/// while no other thread of the program reads the environment.
pub fn restore_user_tunables() {
    let Some(saved) = ftramp_runtime::env::var_os(ENV_USER_TUNABLES) else { return };
    match decode_user_tunables(&saved) {
        Some(value) => ftramp_runtime::env::set_var("GLIBC_TUNABLES", value),
        None => ftramp_runtime::env::remove_var("GLIBC_TUNABLES"),
    }
    ftramp_runtime::env::remove_var(ENV_USER_TUNABLES);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_surplus_is_raised_by_the_need_and_the_users_tunables_are_kept() {
        assert_eq!(tunables(None, 100), None);
        assert_eq!(tunables(Some(""), ROOM), None);
        assert_eq!(tunables(Some("glibc.malloc.check=3"), 100).as_deref(), Some("glibc.malloc.check=3"));
        assert_eq!(tunables(None, 4096).as_deref(), Some("glibc.rtld.optional_static_tls=4608"));
        // Rounded up to 64 bytes.
        assert_eq!(tunables(None, 785_760).as_deref(), Some("glibc.rtld.optional_static_tls=786304"));
        assert_eq!(
            tunables(Some("glibc.malloc.check=3:glibc.rtld.optional_static_tls=100"), 4096).as_deref(),
            Some("glibc.malloc.check=3:glibc.rtld.optional_static_tls=4608")
        );
        // A larger surplus of the user's stays.
        assert_eq!(tunables(Some("glibc.rtld.optional_static_tls=100000"), 4096).as_deref(), Some("glibc.rtld.optional_static_tls=100000"));
    }

    #[test]
    fn user_tunables_round_trip_through_their_encoding() {
        assert_eq!(encode_user_tunables(None), "-");
        assert_eq!(encode_user_tunables(Some(OsStr::new(""))), "=");
        assert_eq!(encode_user_tunables(Some(OsStr::new("a=1:b=2"))), "=a=1:b=2");
        for u in [None, Some(OsStr::new("")), Some(OsStr::new("a=1:b=2"))] {
            assert_eq!(decode_user_tunables(&encode_user_tunables(u)), u);
        }
    }

    /// A library found only through the loader's cache (a directory listed
    /// in ld.so.conf, as `/usr/local/lib` is on Debian): a cache built by
    /// `ldconfig` for a directory of our own.  Also `LD_LIBRARY_PATH`, a
    /// preload, and a `DT_NEEDED` path with `$ORIGIN`.
    #[test]
    fn a_library_found_only_through_the_loaders_cache_is_counted() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let libdir = dir.join("lib");
        std::fs::create_dir_all(&libdir).unwrap();
        let cc = |args: &[&str]| {
            let o = std::process::Command::new("cc").args(args).output().expect("cc runs");
            assert!(o.status.success(), "cc {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        };
        std::fs::write(dir.join("big.c"), "__attribute__((tls_model(\"initial-exec\"))) __thread char big_buf[3000];\nint big_touch(int i) { return ++big_buf[i]; }\n").unwrap();
        std::fs::write(dir.join("m.c"), "int big_touch(int);\nint main(void) { return big_touch(1) - 1; }\n").unwrap();
        let lib = libdir.join("libftrampcachetest.so");
        cc(&["-shared", "-fPIC", "-o", lib.to_str().unwrap(), dir.join("big.c").to_str().unwrap()]);
        let exe = dir.join("m");
        cc(&["-o", exe.to_str().unwrap(), dir.join("m.c").to_str().unwrap(), "-L", libdir.to_str().unwrap(), "-lftrampcachetest"]);
        let (conf, cache) = (dir.join("ld.so.conf"), dir.join("ld.so.cache"));
        std::fs::write(&conf, format!("{}\n", libdir.display())).unwrap();
        let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"].into_iter().find(|p| Path::new(p).exists()).expect("ldconfig (glibc's) is installed");
        let o = std::process::Command::new(ldconfig).args(["-X", "-f"]).arg(&conf).arg("-C").arg(&cache).output().unwrap();
        assert!(o.status.success(), "ldconfig: {}", String::from_utf8_lossy(&o.stderr));
        assert!(ld_so_cache(&cache).iter().any(|(n, p)| n == "libftrampcachetest.so" && *p == lib), "{:?}", ld_so_cache(&cache));
        let want = Some(("libftrampcachetest.so".to_string(), 3000));
        assert_eq!(need_with_cache(&exe, None, &[], &cache), want);
        // Without the cache entry it is not found (what the walk missed).
        assert_eq!(need_with_cache(&exe, None, &[], &dir.join("none")), None);
        // LD_LIBRARY_PATH finds it too; a preload's TLS counts.
        assert_eq!(need_with_cache(&exe, Some(libdir.as_os_str()), &[], &dir.join("none")), want);
        assert_eq!(need_with_cache(&exe, None, std::slice::from_ref(&lib), &dir.join("none")), want);
        // A library named by a path with `$ORIGIN` (its soname so).
        let origin_lib = libdir.join("libftramporigin.so");
        cc(&["-shared", "-fPIC", "-Wl,-soname,$ORIGIN/lib/libftramporigin.so", "-o", origin_lib.to_str().unwrap(), dir.join("big.c").to_str().unwrap()]);
        let exe2 = dir.join("m2");
        cc(&["-o", exe2.to_str().unwrap(), dir.join("m.c").to_str().unwrap(), origin_lib.to_str().unwrap()]);
        assert_eq!(needed(&exe2).first().map(String::as_str), Some(libdir.join("libftramporigin.so").to_str().unwrap()));
        assert_eq!(need_with_cache(&exe2, None, &[], &dir.join("none")), Some(("libftramporigin.so".to_string(), 3000)));
    }
}
