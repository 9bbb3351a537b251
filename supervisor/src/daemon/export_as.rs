//! An export a repository-role client asked for, written with the client's own file system
//! rights. The daemon runs as root; writing the bundle at a path the client names as root would
//! let the client create files wherever root may. So the bundle is exported into the
//! workspace's own scratch directory first, every file of it opened there, and only then does
//! this process (the launch child: single-threaded, and gone after the job) take the client's
//! file system ids — fsuid, fsgid and its primary gid as the only group — to create the
//! directory and the files: the kernel checks the path as it would for the client, and what is
//! made is the client's.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use crate::repository::export::{self, ExportReport, BUNDLE_FILES};
use crate::repository::workspace::{self, RepoError};
use nix::unistd::{setfsgid, setfsuid, setgroups, Gid, Uid};

/// Export the workspace at `state` to `out`, written as `uid`:`gid`.
pub fn export(state: &Path, out: &Path, uid: u32, gid: u32) -> Result<ExportReport, RepoError> {
    let ws = workspace::open(state)?;
    let staging = ws.dir.join("tmp").join(format!("export-for-{uid}-{}", std::process::id()));
    let report = export::export(&ws, &staging)?;
    let copied = copy_as(&staging, out, uid, gid);
    // Back to root's file system ids to remove the staging copy (a root-owned directory).
    setfsuid(Uid::from_raw(0));
    setfsgid(Gid::from_raw(0));
    let _ = fs::remove_dir_all(&staging);
    copied.map_err(|e| RepoError::Usage(format!("--out {}: {e} (as uid {uid} gid {gid})", out.display())))?;
    Ok(report)
}

/// Copy the bundle in `staging` to a new directory `out`, created as `uid`:`gid`.
fn copy_as(staging: &Path, out: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let sources = BUNDLE_FILES.iter().map(|f| File::open(staging.join(f))).collect::<io::Result<Vec<_>>>()?;
    setgroups(&[Gid::from_raw(gid)])?;
    setfsgid(Gid::from_raw(gid));
    setfsuid(Uid::from_raw(uid));
    // setfsuid answers with the previous id whether or not it changed: read it back.
    if setfsuid(Uid::from_raw(uid)) != Uid::from_raw(uid) || setfsgid(Gid::from_raw(gid)) != Gid::from_raw(gid) {
        return Err(io::Error::other("could not take the client's file system ids"));
    }
    fs::DirBuilder::new().mode(0o755).create(out)?;
    let written = write_all(sources, out);
    if written.is_err() {
        let _ = fs::remove_dir_all(out);
    }
    written
}

fn write_all(sources: Vec<File>, out: &Path) -> io::Result<()> {
    for (name, mut src) in BUNDLE_FILES.iter().zip(sources) {
        let mut dst = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(out.join(name))?;
        io::copy(&mut src, &mut dst)?;
        dst.sync_all()?;
    }
    File::open(out)?.sync_all()
}
