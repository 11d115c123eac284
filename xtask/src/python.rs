//! Python tools the tasks install from PyPI, each in its own virtualenv
//! under the target directory, pinned.

use std::path::PathBuf;
use std::process::Command;

use crate::target_dir;

/// The program `bin` of a virtualenv `venv` (under the target directory)
/// holding the pinned PyPI `packages`; made once, again when the pins change.
pub(crate) fn python_tool(venv: &str, packages: &[&str], bin: &str) -> Result<PathBuf, String> {
    let venv = target_dir().join(venv);
    let program = venv.join("bin").join(bin);
    let marker = venv.join(packages.join(" "));
    if marker.exists() && program.exists() {
        return Ok(program);
    }
    let run = |cmd: &mut Command, what: &str| -> Result<(), String> {
        eprintln!("xtask: {what}");
        match cmd.status() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("{what} failed ({s})")),
            Err(e) => Err(format!("{what}: {e}")),
        }
    };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    )?;
    run(
        Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(packages),
        &format!("pip install {}", packages.join(" ")),
    )?;
    std::fs::write(&marker, "").map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
    Ok(program)
}
