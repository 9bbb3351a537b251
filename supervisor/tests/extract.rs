//! Layer application against ordinary and hostile layers. Every hostile case is refused or
//! contained, and nothing is written outside the root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use chio_supervisor::image::extract::{apply_layer, Budgets, ExtractError, Totals};
use tar::{EntryType, Header};

/// A tar written header by header, so hostile names can be crafted byte for byte.
#[derive(Default)]
struct Tar(Vec<u8>);

impl Tar {
    fn entry(mut self, kind: EntryType, path: &[u8], link: &[u8], data: &[u8], mode: u32) -> Self {
        let mut h = Header::new_ustar();
        h.as_old_mut().name[..path.len()].copy_from_slice(path);
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        self.0.extend_from_slice(h.as_bytes());
        self.0.extend_from_slice(data);
        self.0.resize(self.0.len().div_ceil(512) * 512, 0);
        self
    }
    fn file(self, path: &str, data: &str) -> Self {
        self.entry(EntryType::Regular, path.as_bytes(), b"", data.as_bytes(), 0o644)
    }
    fn raw_file(self, path: &[u8]) -> Self {
        self.entry(EntryType::Regular, path, b"", b"pwned", 0o644)
    }
    fn dir(self, path: &str) -> Self {
        self.entry(EntryType::Directory, path.as_bytes(), b"", b"", 0o755)
    }
    fn symlink(self, path: &str, target: &str) -> Self {
        self.entry(EntryType::Symlink, path.as_bytes(), target.as_bytes(), b"", 0o777)
    }
    fn hardlink(self, path: &str, target: &str) -> Self {
        self.entry(EntryType::Link, path.as_bytes(), target.as_bytes(), b"", 0o644)
    }
    fn pax(self, records: &[(&str, &str)]) -> Self {
        let mut data = Vec::new();
        for (k, v) in records {
            let body = format!(" {k}={v}\n");
            let mut len = body.len() + 1;
            while format!("{len}{body}").len() != len {
                len += 1;
            }
            data.extend_from_slice(format!("{len}{body}").as_bytes());
        }
        self.entry(EntryType::XHeader, b"././@PaxHeader", b"", &data, 0o644)
    }
    fn done(mut self) -> Vec<u8> {
        self.0.extend_from_slice(&[0u8; 1024]);
        self.0
    }
}

struct Fixture {
    base: PathBuf,
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        let base = common::scratch().join(format!("chio-extract-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("root")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/secret"), "untouched").unwrap();
        Fixture { base }
    }
    fn root(&self) -> PathBuf {
        self.base.join("root")
    }
    fn apply(&self, layer: Vec<u8>) -> Result<chio_supervisor::image::extract::LayerReport, ExtractError> {
        self.apply_with(layer, &Budgets::default())
    }
    fn apply_with(
        &self,
        layer: Vec<u8>,
        b: &Budgets,
    ) -> Result<chio_supervisor::image::extract::LayerReport, ExtractError> {
        let dir = std::fs::File::open(self.root()).unwrap();
        apply_layer(dir.as_fd(), &layer[..], b, &mut Totals::default())
    }
    /// The only things outside the root are what the fixture put there.
    fn outside_untouched(&self) {
        let mut names: Vec<String> =
            std::fs::read_dir(&self.base).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["outside", "root"]);
        let outside: Vec<_> = std::fs::read_dir(self.base.join("outside")).unwrap().collect();
        assert_eq!(outside.len(), 1, "something was written into the outside directory");
        assert_eq!(std::fs::read_to_string(self.base.join("outside/secret")).unwrap(), "untouched");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn refused(r: Result<chio_supervisor::image::extract::LayerReport, ExtractError>, needle: &str) {
    match r {
        Err(ExtractError::Refused { why, .. }) => assert!(why.contains(needle), "{why}"),
        other => panic!("expected a refusal containing {needle:?}, got {other:?}"),
    }
}

/// As root, these tests run with the host read-only (see `common`): a layer that escaped its
/// root would meet EROFS. Control: the fixture itself writes in the sealed thread's /tmp.
#[test]
fn layers_are_applied_with_the_host_sealed() {
    let f = Fixture::new("sealed");
    if nix::unistd::geteuid().is_root() {
        assert!(common::host_is_read_only(), "the host is writable from a layer test");
    }
    f.apply(Tar::default().file("a", "x").done()).unwrap();
    assert_eq!(std::fs::read_to_string(f.root().join("a")).unwrap(), "x");
}

#[test]
fn ordinary_layer_with_parents_symlinks_hardlinks_and_duplicates() {
    let f = Fixture::new("ordinary");
    f.apply(
        Tar::default()
            .dir("./")
            .file("usr/bin/tool", "v1")
            .file("usr/bin/tool", "v2")
            .symlink("bin", "usr/bin")
            .hardlink("usr/bin/tool2", "usr/bin/tool")
            .entry(EntryType::Regular, b"usr/bin/su", b"", b"x", 0o4755)
            .done(),
    )
    .unwrap();
    let r = f.root();
    assert_eq!(std::fs::read_to_string(r.join("usr/bin/tool")).unwrap(), "v2", "a later duplicate wins");
    assert_eq!(std::fs::read_link(r.join("bin")).unwrap(), Path::new("usr/bin"));
    let (a, b) =
        (std::fs::metadata(r.join("usr/bin/tool")).unwrap(), std::fs::metadata(r.join("usr/bin/tool2")).unwrap());
    assert_eq!(a.ino(), b.ino());
    assert_eq!(std::fs::metadata(r.join("usr/bin/su")).unwrap().permissions().mode() & 0o7777, 0o4755);
    f.outside_untouched();
}

#[test]
fn setuid_is_kept_and_reported_devices_and_fifos_skipped() {
    let f = Fixture::new("report");
    let report = f
        .apply(
            Tar::default()
                .entry(EntryType::Regular, b"su", b"", b"x", 0o4755)
                .entry(EntryType::Regular, b"plain", b"", b"x", 0o755)
                .entry(EntryType::Directory, b"sgid-dir", b"", b"", 0o2775)
                .entry(EntryType::Directory, b"plain-dir", b"", b"", 0o1777)
                .entry(EntryType::Char, b"dev/null", b"", b"", 0o666)
                .entry(EntryType::Block, b"dev/sda", b"", b"", 0o660)
                .entry(EntryType::Fifo, b"pipe", b"", b"", 0o644)
                .done(),
        )
        .unwrap();
    assert_eq!(report.setuid, ["su", "sgid-dir"], "set-id modes only (the sticky bit is not one)");
    assert_eq!(report.skipped_devices, ["dev/null", "dev/sda"]);
    assert_eq!(report.skipped_fifos, ["pipe"]);
    assert!(
        !f.root().join("dev/null").exists() && !f.root().join("dev/sda").exists() && !f.root().join("pipe").exists()
    );
}

#[test]
fn dotdot_and_absolute_names_are_refused() {
    for (tag, name) in [("dotdot", &b"../escape"[..]), ("deep", b"a/../../escape"), ("abs", b"/escape")] {
        let f = Fixture::new(tag);
        let r = f.apply(Tar::default().raw_file(name).done());
        assert!(matches!(r, Err(ExtractError::Refused { .. })), "{tag}: {r:?}");
        f.outside_untouched();
    }
}

#[test]
fn nothing_is_written_through_a_symlink() {
    let f = Fixture::new("symwrite");
    let outside = f.base.join("outside");
    // A symlink naming a host path is resolved inside the root, where that path does not exist.
    let r = f.apply(Tar::default().symlink("link", outside.to_str().unwrap()).file("link/pwned", "x").done());
    refused(r, "does not have");
    f.outside_untouched();
    // A relative symlink climbing out: `..` stops at the root.
    let f = Fixture::new("symwrite-rel");
    refused(f.apply(Tar::default().symlink("up", "../outside").file("up/pwned", "x").done()), "does not have");
    f.outside_untouched();
    // Where the target exists inside the root, the write lands there (containerd's and umoci's
    // rule), whether the link is absolute or climbs with `..`.
    let f = Fixture::new("symwrite-inside");
    f.apply(
        Tar::default()
            .dir("inner")
            .symlink("abs", "/inner")
            .symlink("rel", "../../../inner")
            .file("abs/one", "1")
            .file("rel/two", "2")
            .done(),
    )
    .unwrap();
    assert_eq!(std::fs::read_to_string(f.root().join("inner/one")).unwrap(), "1");
    assert_eq!(std::fs::read_to_string(f.root().join("inner/two")).unwrap(), "2");
    assert!(std::fs::symlink_metadata(f.root().join("abs")).unwrap().file_type().is_symlink());
    f.outside_untouched();
}

#[test]
fn a_file_replaces_a_symlink_instead_of_writing_through_it() {
    let f = Fixture::new("symreplace");
    let secret = f.base.join("outside/secret");
    f.apply(Tar::default().symlink("a", secret.to_str().unwrap()).file("a", "mine").done()).unwrap();
    assert!(std::fs::symlink_metadata(f.root().join("a")).unwrap().is_file());
    assert_eq!(std::fs::read_to_string(f.root().join("a")).unwrap(), "mine");
    f.outside_untouched();
}

#[test]
fn the_root_cannot_be_a_symlink() {
    let f = Fixture::new("rootlink");
    refused(f.apply(Tar::default().symlink("./", "/").done()), "root must be a directory");
}

#[test]
fn hardlinks_stay_inside_the_root() {
    let outside = |f: &Fixture| f.base.join("outside/secret").to_str().unwrap().to_string();
    let f = Fixture::new("hl-dotdot");
    refused(f.apply(Tar::default().hardlink("h", "../outside/secret").done()), "'..'");
    let f2 = Fixture::new("hl-abs");
    refused(f2.apply(Tar::default().hardlink("h", &outside(&f2)).done()), "absolute");
    let f3 = Fixture::new("hl-through-symlink");
    let target_dir = f3.base.join("outside");
    refused(
        f3.apply(Tar::default().symlink("l", target_dir.to_str().unwrap()).hardlink("h", "l/secret").done()),
        "does not have",
    );
    let f4 = Fixture::new("hl-to-symlink");
    refused(f4.apply(Tar::default().symlink("s", &outside(&f4)).hardlink("h", "s").done()), "not a regular file");
    let f5 = Fixture::new("hl-missing");
    refused(f5.apply(Tar::default().hardlink("h", "nope").done()), "does not exist");
    for f in [f, f2, f3, f4, f5] {
        f.outside_untouched();
    }
}

#[test]
fn whiteouts_remove_lower_layers_only() {
    let f = Fixture::new("whiteout");
    f.apply(Tar::default().file("d/a", "1").file("d/b", "2").file("x", "3").file("o/old", "4").done()).unwrap();
    f.apply(
        Tar::default()
            .file("d/.wh.a", "")
            .file(".wh.x", "")
            .file("o/new", "5")
            .file("o/.wh..wh..opq", "")
            .file("n", "6")
            .file(".wh.n", "")
            .done(),
    )
    .unwrap();
    let r = f.root();
    assert!(!r.join("d/a").exists() && !r.join("x").exists() && !r.join("o/old").exists());
    assert!(r.join("d/b").exists(), "untouched sibling");
    assert_eq!(
        std::fs::read_to_string(r.join("o/new")).unwrap(),
        "5",
        "created in this layer: survives the opaque whiteout"
    );
    assert!(r.join("n").exists(), "created in this layer: survives its own whiteout");
    assert!(!r.join("d/.wh.a").exists() && !r.join("o/.wh..wh..opq").exists(), "whiteouts are not files");
}

#[test]
fn invalid_whiteouts_are_refused() {
    for (tag, name) in [("empty", ".wh."), ("dot", ".wh.."), ("dotdot", "d/.wh..."), ("nested", ".wh..wh.x")] {
        let f = Fixture::new(&format!("wh-{tag}"));
        let r = f.apply(Tar::default().file(name, "").done());
        assert!(matches!(r, Err(ExtractError::Refused { .. })), "{name}: {r:?}");
        f.outside_untouched();
    }
}

#[test]
fn pax_paths_xattrs_and_ownership() {
    let f = Fixture::new("pax");
    let long = format!("deep/{}/file", "d".repeat(150));
    f.apply(
        Tar::default()
            .pax(&[
                ("path", &long),
                ("uid", "1234"),
                ("gid", "4321"),
                ("SCHILY.xattr.user.tag", "v"),
                ("SCHILY.xattr.security.capability", "x"),
            ])
            .file("ignored-name", "long")
            .done(),
    )
    .unwrap();
    let p = f.root().join(&long);
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "long");
    let m = std::fs::metadata(&p).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 4321), "numeric owner applied (the suite runs as root)");
    // user.* xattrs are applied; anything else (file capabilities!) is not.
    assert_eq!(xattr(&p, "user.tag").as_deref(), Some(&b"v"[..]));
    assert_eq!(xattr(&p, "security.capability"), None, "a file capability was applied");
    assert!(!f.root().join("ignored-name").exists());
}

/// The value of extended attribute `name` of `p` (not following a symlink), or None.
fn xattr(p: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: NUL-terminated strings and a buffer of the given length.
    let n = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| {
        buf.truncate(n as usize);
        buf
    })
}

#[test]
fn budgets_hold_against_bombs() {
    let small = Budgets { max_entries: 50, max_bytes: 1 << 20, max_header: 4096, ..Budgets::default() };
    let f = Fixture::new("count-bomb");
    let mut t = Tar::default();
    for i in 0..100 {
        t = t.file(&format!("f{i}"), "x");
    }
    assert!(matches!(f.apply_with(t.done(), &small), Err(ExtractError::Budget(e)) if e.contains("entries")));
    let f = Fixture::new("size-bomb");
    let big = vec![0u8; 2 << 20];
    let r = f.apply_with(Tar::default().entry(EntryType::Regular, b"zeros", b"", &big, 0o644).done(), &small);
    assert!(matches!(r, Err(ExtractError::Budget(e)) if e.contains("bytes")));
    let f = Fixture::new("pax-bomb");
    let huge = "y".repeat(64 << 10);
    let r = f.apply_with(Tar::default().pax(&[("comment", &huge)]).file("a", "x").done(), &small);
    assert!(matches!(r, Err(ExtractError::Budget(e)) if e.contains("header")));
    let f = Fixture::new("path-bomb");
    let deep = vec!["d"; 300].join("/");
    let r = f.apply(Tar::default().pax(&[("path", &deep)]).file("x", "x").done());
    assert!(matches!(r, Err(ExtractError::Budget(e)) if e.contains("depth")));
}

#[test]
fn cross_layer_hardlinks_and_merged_usr() {
    let f = Fixture::new("crosslayer");
    f.apply(Tar::default().symlink("bin", "usr/bin").symlink("lib", "usr/lib").file("usr/bin/sh", "shell").done())
        .unwrap();
    f.apply(Tar::default().hardlink("usr/bin/dash", "usr/bin/sh").file("usr/lib/libc.so", "c").done()).unwrap();
    let r = f.root();
    let (a, b) = (std::fs::metadata(r.join("usr/bin/sh")).unwrap(), std::fs::metadata(r.join("usr/bin/dash")).unwrap());
    assert_eq!(a.ino(), b.ino(), "a hardlink to a lower layer's file");
    assert_eq!(std::fs::read_link(r.join("lib")).unwrap(), Path::new("usr/lib"));
    // A later layer adding bin/foo over the merged-/usr base lands in usr/bin (as containerd
    // and umoci do), the symlink staying a symlink.
    f.apply(Tar::default().file("bin/foo", "x").done()).unwrap();
    assert_eq!(std::fs::read_to_string(r.join("usr/bin/foo")).unwrap(), "x");
    assert!(std::fs::symlink_metadata(r.join("bin")).unwrap().file_type().is_symlink());
    f.outside_untouched();
}

#[test]
fn a_replaced_directory_is_not_written_through_a_stale_handle() {
    let f = Fixture::new("stale");
    let outside = f.base.join("outside");
    let r = f.apply(
        Tar::default()
            .file("a/one", "1")
            .file("a/two", "2")
            .symlink("a", outside.to_str().unwrap())
            .file("a/three", "3")
            .done(),
    );
    // Resolved inside the root, where the host path does not exist.
    refused(r, "does not have");
    f.outside_untouched();
}

#[test]
fn file_modes_and_owners_are_exact_whatever_the_umask() {
    // Files are created with their permission bits and fixed up only where they differ: a
    // group-writable mode the usual umask (022) trims, setuid bits (set after ownership), a
    // mode tighter than the default, and a non-root owner must all come out exact. (The umask
    // is process-wide, so this test leaves it as the test runner has it.)
    let f = Fixture::new("modes");
    let applied = f.apply(
        Tar::default()
            .entry(EntryType::Regular, b"group-writable", b"", b"x", 0o664)
            .entry(EntryType::Regular, b"setuid", b"", b"x", 0o4755)
            .entry(EntryType::Regular, b"private", b"", b"x", 0o400)
            .pax(&[("uid", "1000"), ("gid", "1000")])
            .entry(EntryType::Regular, b"owned", b"", b"x", 0o2750)
            .done(),
    );
    applied.unwrap();
    let mode = |n: &str| std::fs::metadata(f.root().join(n)).unwrap().mode() & 0o7777;
    assert_eq!(
        (mode("group-writable"), mode("setuid"), mode("private"), mode("owned")),
        (0o664, 0o4755, 0o400, 0o2750)
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let m = std::fs::metadata(f.root().join("owned")).unwrap();
        assert_eq!((m.uid(), m.gid()), (1000, 1000));
    }
}

/// A directory entry over a lower layer's symlink replaces the symlink: its mode, owner and
/// times are set on the new directory, never through the link onto what it names (here a
/// directory outside the root, which keeps its mode).
#[test]
fn a_directory_entry_replaces_a_symlink_instead_of_changing_its_target() {
    let f = Fixture::new("dir-over-link");
    let outside = f.base.join("outside");
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).unwrap();
    f.apply(Tar::default().symlink("d", outside.to_str().unwrap()).done()).unwrap();
    f.apply(Tar::default().entry(EntryType::Directory, b"d", b"", b"", 0o777).done()).unwrap();
    let d = std::fs::symlink_metadata(f.root().join("d")).unwrap();
    assert!(d.is_dir() && d.mode() & 0o7777 == 0o777, "{:o}", d.mode());
    assert_eq!(std::fs::metadata(&outside).unwrap().mode() & 0o7777, 0o700, "the link's target was changed");
    f.outside_untouched();
}

/// Directories, symlinks and FIFOs get their entry's mode, owner and modification time too.
#[test]
fn every_kind_of_entry_gets_its_mode_and_time() {
    let f = Fixture::new("dir-modes");
    let allow = Budgets { allow_fifos: true, ..Budgets::default() };
    let layer = Tar::default()
        .entry(EntryType::Directory, b"d", b"", b"", 0o751)
        .entry(EntryType::Fifo, b"p", b"", b"", 0o640)
        .symlink("l", "d")
        .done();
    f.apply_with(layer, &allow).unwrap();
    for (name, mode) in [("d", Some(0o751)), ("p", Some(0o640)), ("l", None)] {
        let m = std::fs::symlink_metadata(f.root().join(name)).unwrap();
        assert_eq!(m.mtime(), 1_700_000_000, "{name}");
        if let Some(mode) = mode {
            assert_eq!(m.mode() & 0o7777, mode, "{name}");
        }
    }
    // Without the budget's consent a FIFO is skipped and reported.
    let f = Fixture::new("fifo-skipped");
    let r = f.apply(Tar::default().entry(EntryType::Fifo, b"p", b"", b"", 0o640).done()).unwrap();
    assert_eq!(r.skipped_fifos, ["p"]);
    assert!(!f.root().join("p").exists());
}

/// The content budget counts every file of the import, not the largest one.
#[test]
fn the_byte_budget_adds_up_across_files() {
    let small = Budgets { max_bytes: 1 << 20, ..Budgets::default() };
    let f = Fixture::new("bytes-sum");
    let part = vec![7u8; 400 << 10];
    let mut t = Tar::default();
    for i in 0..3 {
        t = t.entry(EntryType::Regular, format!("f{i}").as_bytes(), b"", &part, 0o644);
    }
    assert!(matches!(f.apply_with(t.done(), &small), Err(ExtractError::Budget(e)) if e.contains("bytes")));
    // Exactly at the budget: accepted.
    let f = Fixture::new("bytes-exact");
    let exact = vec![7u8; 1 << 20];
    f.apply_with(Tar::default().entry(EntryType::Regular, b"f", b"", &exact, 0o644).done(), &small).unwrap();
}

/// Each budget admits exactly its limit and refuses one more.
#[test]
fn budgets_are_exact_at_their_limits() {
    let b = Budgets { max_entries: 3, max_path: 8, max_depth: 3, max_header: 64, ..Budgets::default() };
    let at = |tag: &str, t: Tar| Fixture::new(tag).apply_with(t.done(), &b);
    assert!(at("entries", Tar::default().file("a", "").file("b", "").file("c", "")).is_ok());
    let r = at("entries+1", Tar::default().file("a", "").file("b", "").file("c", "").file("d", ""));
    assert!(matches!(r, Err(ExtractError::Budget(e)) if e.contains("more than 3 entries")));
    assert!(at("path", Tar::default().file("abcdefgh", "")).is_ok());
    let r = at("path+1", Tar::default().file("abcdefghi", ""));
    assert!(matches!(r, Err(ExtractError::Budget(e)) if e.contains("path of 9 bytes")));
    assert!(at("depth", Tar::default().file("a/b/c", "")).is_ok());
    let r = at("depth+1", Tar::default().file("a/b/c/d", ""));
    assert!(matches!(r, Err(ExtractError::Budget(e)) if e.contains("depth 4")));
    // A PAX header of exactly 64 bytes (one record), then one of 65.
    let record = |n: usize| ("comment", "z".repeat(n));
    let (k, v) = record(64 - " comment=\n".len() - 2);
    assert!(at("header", Tar::default().pax(&[(k, &v)])).is_ok());
    let (k, v) = record(65 - " comment=\n".len() - 2);
    let r = at("header+1", Tar::default().pax(&[(k, &v)]));
    assert!(matches!(&r, Err(ExtractError::Budget(e)) if e.contains("65-byte")), "{r:?}");
}

/// GNU long names and long link targets (what GNU tar writes past 100 bytes), a PAX link
/// target, and a PAX global header (which names no file).
#[test]
fn long_names_long_links_and_global_headers() {
    let f = Fixture::new("long");
    let long = format!("{}/{}", "d".repeat(90), "f".repeat(90));
    let target = format!("../{}", "t".repeat(150));
    let nul = |s: &str| [s.as_bytes(), b"\0"].concat();
    let layer = Tar::default()
        .entry(EntryType::XGlobalHeader, b"pax_global_header", b"", b"22 comment=from git\n", 0o644)
        .entry(EntryType::GNULongName, b"././@LongLink", b"", &nul(&long), 0o644)
        .entry(EntryType::Regular, b"truncated-name", b"", b"content", 0o644)
        .entry(EntryType::GNULongName, b"././@LongLink", b"", &nul("gnu-link"), 0o644)
        .entry(EntryType::GNULongLink, b"././@LongLink", b"", &nul(&target), 0o644)
        .entry(EntryType::Symlink, b"truncated-link", b"truncated", b"", 0o777)
        .pax(&[("path", "pax-link"), ("linkpath", &target)])
        .symlink("ignored", "truncated")
        .done();
    f.apply(layer).unwrap();
    let r = f.root();
    assert_eq!(std::fs::read_to_string(r.join(&long)).unwrap(), "content");
    assert_eq!(std::fs::read_link(r.join("gnu-link")).unwrap(), Path::new(&target));
    assert_eq!(std::fs::read_link(r.join("pax-link")).unwrap(), Path::new(&target));
    let mut top: Vec<String> =
        std::fs::read_dir(&r).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    top.sort();
    assert_eq!(top, ["d".repeat(90), "gnu-link".into(), "pax-link".into()], "headers made files of their own");
}

/// PAX records whose length field lies are refused (never a panic on the slice it names), and
/// so are PAX sizes (files over 8 GiB).
#[test]
fn malformed_pax_records_are_refused() {
    let raw =
        |data: &[u8]| Tar::default().entry(EntryType::XHeader, b"././@PaxHeader", b"", data, 0o644).file("a", "x");
    for (tag, data) in [
        ("too-long", &b"99 path=a\n"[..]),
        ("length-is-prefix", b"3 path=a\n"),
        ("length-short", b"2 path=a\n"),
        ("length-one", b"1 path=a\n"),
        ("no-newline", b"10 path=ab"),
        ("no-equals", b"9 pathab\n"),
        ("no-number", b"x path=a\n"),
    ] {
        let r = Fixture::new(tag).apply(raw(data).done());
        assert!(matches!(r, Err(ExtractError::Refused { .. })), "{tag}: {r:?}");
    }
    let r = Fixture::new("pax-size").apply(Tar::default().pax(&[("size", "9000000000")]).file("a", "x").done());
    refused(r, "PAX size");
}

/// A directory entry over a lower layer's directory keeps what is in it (it only sets the
/// directory's own mode, owner and time).
#[test]
fn a_directory_entry_keeps_a_lower_layers_directory() {
    let f = Fixture::new("dir-keeps");
    f.apply(Tar::default().dir("d").file("d/lower", "1").done()).unwrap();
    f.apply(Tar::default().entry(EntryType::Directory, b"d", b"", b"", 0o700).file("d/upper", "2").done()).unwrap();
    assert_eq!(std::fs::read_to_string(f.root().join("d/lower")).unwrap(), "1");
    assert_eq!(std::fs::read_to_string(f.root().join("d/upper")).unwrap(), "2");
    assert_eq!(std::fs::metadata(f.root().join("d")).unwrap().mode() & 0o7777, 0o700);
}

/// A path through a file, or through a symlink loop, is refused saying which.
#[test]
fn a_path_through_a_file_or_a_link_loop_is_named() {
    let f = Fixture::new("through-file");
    refused(f.apply(Tar::default().file("f", "x").file("f/x", "y").done()), "f is not a directory");
    let f = Fixture::new("loop");
    refused(f.apply(Tar::default().symlink("a", "b").symlink("b", "a").file("a/x", "y").done()), "too many symlinks");
    f.outside_untouched();
}

/// An extended attribute the file system refuses (a value over its 64 KiB limit) fails the
/// layer, naming the entry, rather than vanishing.
#[test]
fn an_xattr_that_cannot_be_set_fails_the_layer() {
    let f = Fixture::new("xattr-big");
    let big = "v".repeat(70 << 10);
    let r = f.apply(Tar::default().pax(&[("SCHILY.xattr.user.big", &big)]).file("a", "x").done());
    assert!(matches!(&r, Err(ExtractError::Io { path, .. }) if path == "a"), "{r:?}");
}
