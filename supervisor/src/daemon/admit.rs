//! Who may ask what of the daemon: one decision over the typed request, field by field for a
//! launch, operation by operation and workspace by workspace for the repository leg.
//! An allow-list. The admin role may launch anything `chio cage run` takes; the launch role only
//! a signed policy's launch, naming no host path and widening nothing; any other role (the
//! repository role, whose commands run through its granted workspaces) nothing. What chio's own
//! roads set — annotations of a launch's origin, the loopback ports of a session's worker — no
//! client sets. The daemon then puts in what is its own: its receipt store and key, and whether
//! the launch is receipted.

use std::path::{Path, PathBuf};

use crate::launch::LaunchRequest;
use crate::launch_plan::PlanOptions;

use super::config::{Role, WorkspaceGrant};
use super::job::DaemonSide;
use crate::repository::operation::Operation as R;

/// A launch as the daemon will run it.
#[derive(Debug)]
pub struct Admitted {
    /// The request, with the daemon's decisions in it.
    pub request: LaunchRequest,
    /// The daemon's receipt store and kernel key (None: the daemon has no key, and its launches
    /// are not receipted).
    pub receipts: Option<(PathBuf, PathBuf)>,
}

/// Admit `req` from `uid` in `role`, or say why not (the words go to the client).
pub fn launch(role: Role, uid: u32, daemon: &DaemonSide, mut req: LaunchRequest) -> Result<Admitted, String> {
    if role != Role::Admin && role != Role::Launch {
        return Err(format!(
            "uid {uid} has the {} role: it may not launch (its commands run through `chio repository execute` on \
             the workspaces granted to it)",
            role.name()
        ));
    }
    let road_only = fields_set(&req.options).into_iter().filter(|f| ROAD_FIELDS.contains(f)).collect::<Vec<_>>();
    if !road_only.is_empty() {
        return Err(format!("{}: set by chio's own launches, never by a client", road_only.join(", ")));
    }
    if role == Role::Launch {
        let Some(p) = &req.policy else {
            return Err(format!(
                "uid {uid} has the launch role: it may only launch under a signed policy (--policy, --policy-signer, --manifest)"
            ));
        };
        let mut widening = fields_set(&req.options);
        if p.allow_root {
            widening.push("allow_root");
        }
        if p.image_store.is_some() {
            widening.push("image_store");
        }
        if !widening.is_empty() {
            return Err(format!(
                "uid {uid}: {} name host paths or widen a policy (--workspace, --state-dir, --allow-root-policy); \
                 only the admin role may give them to the supervisor",
                widening.join(", ")
            ));
        }
    }
    let receipts = daemon.kernel_key.as_ref().map(|key| (daemon.receipt_db.clone(), key.clone()));
    if let Some(p) = &mut req.policy {
        if daemon.policy_signers.is_empty() {
            return Err("this supervisor pins no policy signers (policy_signers in its configuration)".into());
        }
        if !daemon.policy_signers.contains(&p.signer) {
            return Err(format!(
                "the policy signer {} is not one this supervisor pins (policy_signers in its configuration)",
                p.signer
            ));
        }
        p.receipted = receipts.is_some();
    }
    Ok(Admitted { request: req, receipts })
}

/// Options only chio's own roads set.
const ROAD_FIELDS: [&str; 2] = ["annotations", "tcp_ports"];

/// The options `o` sets beyond a bare command. Every field of [`PlanOptions`] is named here (the
/// destructuring stops compiling when one is added, until someone decides who may set it).
fn fields_set(o: &PlanOptions) -> Vec<&'static str> {
    let bare = PlanOptions::new(o.argv.clone());
    let PlanOptions {
        argv: _,
        mode,
        net,
        rootfs,
        image,
        workspace,
        cwd,
        binds,
        env_files,
        env,
        uid,
        gid,
        limits,
        expect_sha256,
        annotations,
        tcp_ports,
    } = o;
    let set = [
        ("mode", *mode != bare.mode),
        ("net", *net != bare.net),
        ("rootfs", rootfs.is_some()),
        ("image", image.is_some()),
        ("workspace", workspace.is_some()),
        ("cwd", cwd.is_some()),
        ("binds", !binds.is_empty()),
        ("env_files", !env_files.is_empty()),
        ("env", !env.is_empty()),
        ("uid", uid.is_some()),
        ("gid", gid.is_some()),
        ("limits", *limits != bare.limits),
        ("expect_sha256", expect_sha256.is_some()),
        ("annotations", !annotations.is_empty()),
        ("tcp_ports", !tcp_ports.is_empty()),
    ];
    set.iter().filter(|(_, s)| *s).map(|(n, _)| *n).collect()
}

/// Admit the repository operation `cmd` from `uid` in `role`, putting the daemon's and the
/// grant's own paths in, or say why not. An admin may ask anything `chio repository` takes (an
/// `init` without `--kernel-key` signs with the daemon's key). The repository role: `execute`,
/// `status` and `export` on a workspace granted to its uid, and `init` of a granted workspace
/// from one of the grant's `sources`, signed with the daemon's key and on the daemon's image
/// store. Paths are compared after resolving both sides, and the command then names the grant's
/// own paths, not the client's: a link the client swaps after the check cannot point the
/// operation elsewhere.
pub fn repository(role: Role, uid: u32, daemon: &DaemonSide, cmd: &mut R) -> Result<(), String> {
    let job = &Asker { uid, daemon };
    if role == Role::Admin {
        if let R::Init { kernel_key: key @ None, .. } = cmd {
            *key = Some(daemon_key(job)?);
        }
        return Ok(());
    }
    if role != Role::Repository {
        return Err(format!("uid {uid}: the repository operations need the admin or repository role"));
    }
    match cmd {
        R::Execute { state, .. } | R::Status { state, .. } | R::Export { state, .. } => {
            *state = existing_grant(job, state)?.state.clone();
            Ok(())
        }
        R::Init { state, repository, image_store, kernel_key, .. } => {
            if kernel_key.is_some() || image_store.is_some() {
                return Err(format!(
                    "uid {uid}: --kernel-key and --image-store are the supervisor's own (it signs with its key and \
                     runs on its image store): give neither"
                ));
            }
            let grant = new_grant(job, state)?;
            let source = granted_source(grant, repository).ok_or_else(|| {
                format!(
                    "repository {} is not a source granted to uid {uid} for workspace {} (sources in the \
                     supervisor's configuration)",
                    repository.display(),
                    grant.state.display()
                )
            })?;
            *state = grant.state.clone();
            *repository = source.clone();
            *kernel_key = Some(daemon_key(job)?);
            *image_store = Some(job.daemon.state_dir.clone());
            Ok(())
        }
        _ => Err(format!("uid {uid}: the repository role may run init, execute, status and export only")),
    }
}

/// Who asks, and the daemon's side of it.
struct Asker<'d> {
    uid: u32,
    daemon: &'d DaemonSide,
}

fn daemon_key(job: &Asker) -> Result<PathBuf, String> {
    job.daemon.kernel_key.clone().ok_or_else(|| {
        "this supervisor has no kernel_key: a workspace it creates needs one to sign its receipts \
         (kernel_key in its configuration)"
            .to_string()
    })
}

fn not_granted(job: &Asker, state: &Path) -> String {
    format!(
        "workspace {} is not granted to uid {} (workspaces in the supervisor's configuration)",
        state.display(),
        job.uid
    )
}

/// The grant naming the existing workspace `state`.
fn existing_grant<'j>(job: &Asker<'j>, state: &Path) -> Result<&'j WorkspaceGrant, String> {
    // A path that does not resolve is "not granted" too: the daemon resolves as root, and its
    // error would tell the client whether a path it cannot see exists.
    let resolved = std::fs::canonicalize(state).map_err(|_| not_granted(job, state))?;
    let same = |w: &&WorkspaceGrant| std::fs::canonicalize(&w.state).is_ok_and(|w| w == resolved);
    job.daemon.workspaces.iter().find(same).ok_or_else(|| not_granted(job, state))
}

/// The grant naming the workspace `state` that `init` is to create (it need not exist yet: its
/// parent is resolved, and the last component compared).
fn new_grant<'j>(job: &Asker<'j>, state: &Path) -> Result<&'j WorkspaceGrant, String> {
    let target = resolve_new(state).ok_or_else(|| not_granted(job, state))?;
    let same = |w: &&WorkspaceGrant| resolve_new(&w.state).is_some_and(|w| w == target);
    job.daemon.workspaces.iter().find(same).ok_or_else(|| not_granted(job, state))
}

fn resolve_new(p: &Path) -> Option<PathBuf> {
    let name = p.file_name()?;
    Some(std::fs::canonicalize(p.parent()?).ok()?.join(name))
}

fn granted_source<'g>(grant: &'g WorkspaceGrant, repository: &Path) -> Option<&'g PathBuf> {
    let resolved = std::fs::canonicalize(repository).ok()?;
    grant.sources.iter().find(|s| std::fs::canonicalize(s).is_ok_and(|s| s == resolved))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::PolicyLaunch;

    const SIGNER: &str = "11aa";

    fn daemon(key: bool) -> DaemonSide {
        DaemonSide {
            state_dir: "/var/lib/chio".into(),
            receipt_db: "/var/lib/chio/receipts.db".into(),
            kernel_key: key.then(|| PathBuf::from("/etc/chio/kernel.seed")),
            policy_signers: vec![SIGNER.into()],
            workspaces: Vec::new(),
        }
    }

    fn bare() -> LaunchRequest {
        LaunchRequest::new(PlanOptions::new(vec!["/usr/bin/tool".into()]))
    }

    fn policy() -> PolicyLaunch {
        PolicyLaunch {
            policy: "{}".into(),
            manifest: "{}".into(),
            signer: SIGNER.into(),
            manifest_key: None,
            allow_root: false,
            image_store: None,
            receipted: false,
        }
    }

    type Set = Box<dyn Fn(&mut PlanOptions)>;

    /// Each option of a launch, set.
    fn each_option() -> Vec<(&'static str, Set)> {
        use chio_cage::{Bind, Mode, NetMode};
        vec![
            ("mode", Box::new(|o| o.mode = Mode::Shadow)),
            ("net", Box::new(|o| o.net = NetMode::Loopback)),
            ("rootfs", Box::new(|o| o.rootfs = Some("/srv/root".into()))),
            (
                "image",
                Box::new(|o| {
                    o.image = Some(crate::launch_plan::ImageChoice {
                        store_dir: None,
                        reference: "app".into(),
                        entrypoint: None,
                    })
                }),
            ),
            ("workspace", Box::new(|o| o.workspace = Some("/srv/ws".into()))),
            ("cwd", Box::new(|o| o.cwd = Some("/tmp".into()))),
            ("binds", Box::new(|o| o.binds.push(Bind { source: "/etc".into(), dest: "/e".into(), writable: false }))),
            ("env_files", Box::new(|o| o.env_files.push("/etc/environment".into()))),
            ("env", Box::new(|o| o.env.push("A=1".into()))),
            ("uid", Box::new(|o| o.uid = Some(0))),
            ("gid", Box::new(|o| o.gid = Some(0))),
            ("limits", Box::new(|o| o.limits.memory_bytes = None)),
            ("expect_sha256", Box::new(|o| o.expect_sha256 = Some("00".into()))),
            ("annotations", Box::new(|o| drop(o.annotations.insert("repository.operation_key".into(), "k".into())))),
            ("tcp_ports", Box::new(|o| o.tcp_ports.push(8080))),
        ]
    }

    /// Role × field: the admin may set every option `chio cage run` has; the launch role none
    /// beside its policy; no client the roads' own fields; the repository role nothing at all.
    #[test]
    fn each_role_may_set_what_it_was_decided_it_may() {
        for (name, set) in each_option() {
            let mut req = bare();
            set(&mut req.options);
            let admin = launch(Role::Admin, 0, &daemon(true), req.clone());
            if ROAD_FIELDS.contains(&name) {
                let why = admin.expect_err(name);
                assert!(why.contains(name) && why.contains("never by a client"), "{why}");
            } else {
                assert!(admin.is_ok(), "admin {name}");
            }
            req.policy = Some(policy());
            let why = launch(Role::Launch, 1000, &daemon(true), req.clone()).expect_err(name);
            assert!(why.contains(name), "launch role {name}: {why}");
            let why = launch(Role::Repository, 1000, &daemon(true), req).expect_err(name);
            assert!(why.contains("may not launch"), "{why}");
        }
        // Every field of the options is among the cases (a new one must be decided for).
        let names: Vec<&str> = each_option().iter().map(|(n, _)| *n).collect();
        let mut all = bare();
        for (_, set) in each_option() {
            set(&mut all.options);
        }
        assert_eq!(fields_set(&all.options), names);
    }

    /// The launch role: a signed policy only, by a pinned signer, without widening it; its
    /// launch is receipted when the daemon has a key, and says so to the policy.
    #[test]
    fn the_launch_role_launches_pinned_policies_only() {
        let why = launch(Role::Launch, 1000, &daemon(true), bare()).unwrap_err();
        assert!(why.contains("only launch under a signed policy"), "{why}");
        let mut req = bare();
        req.policy = Some(policy());
        let admitted = launch(Role::Launch, 1000, &daemon(true), req.clone()).unwrap();
        assert!(admitted.request.policy.as_ref().unwrap().receipted);
        assert_eq!(admitted.receipts.map(|r| r.0), Some(PathBuf::from("/var/lib/chio/receipts.db")));
        let unkeyed = launch(Role::Launch, 1000, &daemon(false), req.clone()).unwrap();
        assert!(!unkeyed.request.policy.as_ref().unwrap().receipted && unkeyed.receipts.is_none());
        for (what, widen) in [
            ("allow_root", (|p: &mut PolicyLaunch| p.allow_root = true) as fn(&mut PolicyLaunch)),
            ("image_store", |p| p.image_store = Some("/home/me/store".into())),
        ] {
            let mut r = req.clone();
            widen(r.policy.as_mut().unwrap());
            let why = launch(Role::Launch, 1000, &daemon(true), r.clone()).unwrap_err();
            assert!(why.contains(what), "{why}");
            assert!(launch(Role::Admin, 0, &daemon(true), r).is_ok(), "the admin may {what}");
        }
        let mut stranger = req.clone();
        stranger.policy.as_mut().unwrap().signer = "22bb".into();
        let why = launch(Role::Launch, 1000, &daemon(true), stranger.clone()).unwrap_err();
        assert!(why.contains("not one this supervisor pins"), "{why}");
        assert!(launch(Role::Admin, 0, &daemon(true), stranger).is_err(), "not even for the admin");
        let mut none_pinned = daemon(true);
        none_pinned.policy_signers.clear();
        assert!(launch(Role::Admin, 0, &none_pinned, req).unwrap_err().contains("pins no policy signers"));
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("chio-admit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn status(state: &Path) -> R {
        R::Status { state: state.to_path_buf(), json: false }
    }

    /// The repository role: `execute`, `status` and `export` on its own granted workspaces, named
    /// by the grant's path whatever path the client gave; `init` of a granted workspace from a
    /// granted source, with the daemon's key and image store and neither of its own; nothing else.
    /// The launch role no repository operation at all; the admin any, with the daemon's key when
    /// it names none.
    #[test]
    fn the_repository_role_works_its_granted_workspaces_only() {
        let dir = scratch("repository");
        let (granted, other, source, fresh) = (dir.join("ws"), dir.join("other"), dir.join("src"), dir.join("new"));
        for d in [&granted, &other, &source] {
            std::fs::create_dir(d).unwrap();
        }
        let mut d = daemon(true);
        d.workspaces = vec![
            WorkspaceGrant { uid: 1000, state: granted.clone(), sources: vec![] },
            WorkspaceGrant { uid: 1000, state: fresh.clone(), sources: vec![source.clone()] },
        ];
        let link = dir.join("link");
        std::os::unix::fs::symlink(&granted, &link).unwrap();
        let mut cmd = R::Execute {
            state: link,
            operation_key: "k".into(),
            deadline: 60,
            json: false,
            command: vec!["true".into()],
        };
        repository(Role::Repository, 1000, &d, &mut cmd).unwrap();
        assert!(matches!(&cmd, R::Execute { state, .. } if *state == granted), "{cmd:?}");
        let mine = |uid| d.workspaces.iter().filter(|w| w.uid == uid).cloned().collect::<Vec<_>>();
        let stranger = DaemonSide { workspaces: mine(1001), ..d.clone() };
        for (daemon, state) in [(&stranger, &granted), (&d, &other), (&d, &dir.join("absent"))] {
            let why = repository(Role::Repository, 1001, daemon, &mut status(state)).unwrap_err();
            assert!(why.contains("is not granted to uid 1001"), "{why}");
        }
        let init = |kernel_key: Option<PathBuf>, image_store: Option<PathBuf>, repository: &Path| R::Init {
            state: fresh.clone(),
            repository: repository.to_path_buf(),
            revision: "HEAD".into(),
            source_path: vec!["package".into()],
            scratch_path: vec![],
            image: None,
            image_store,
            kernel_key,
            server_id: None,
            json: false,
        };
        let mut cmd = init(None, None, &source);
        repository(Role::Repository, 1000, &d, &mut cmd).unwrap();
        match &cmd {
            R::Init { state, kernel_key, image_store, .. } => {
                assert_eq!((state, kernel_key, image_store), (&fresh, &d.kernel_key, &Some(d.state_dir.clone())))
            }
            other => panic!("{other:?}"),
        }
        for mut widened in
            [init(Some("/home/me/key.seed".into()), None, &source), init(None, Some("/home/me/store".into()), &source)]
        {
            let why = repository(Role::Repository, 1000, &d, &mut widened).unwrap_err();
            assert!(why.contains("are the supervisor's own"), "{why}");
        }
        let why = repository(Role::Repository, 1000, &d, &mut init(None, None, &other)).unwrap_err();
        assert!(why.contains("is not a source granted"), "{why}");
        for mut op in [R::Serve { state: granted.clone(), read_prefix: vec![] }, R::Recover { state: granted.clone() }]
        {
            let why = repository(Role::Repository, 1000, &d, &mut op).unwrap_err();
            assert!(why.contains("init, execute, status and export only"), "{why}");
        }
        let why = repository(Role::Launch, 1000, &d, &mut status(&granted)).unwrap_err();
        assert!(why.contains("need the admin or repository role"), "{why}");
        // The admin: any operation, any path; an init without a key signs with the daemon's.
        repository(Role::Admin, 0, &d, &mut R::Recover { state: other.clone() }).unwrap();
        let mut cmd = init(None, None, &other);
        repository(Role::Admin, 0, &d, &mut cmd).unwrap();
        assert!(matches!(&cmd, R::Init { kernel_key, .. } if *kernel_key == d.kernel_key));
        let why = repository(Role::Admin, 0, &daemon(false), &mut init(None, None, &other)).unwrap_err();
        assert!(why.contains("has no kernel_key"), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
