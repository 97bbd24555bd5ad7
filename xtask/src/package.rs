//! `cargo xtask package`: every published crate packaged as crates.io would receive it,
//! without uploading, and the packaged sources compiled, so a broken package fails CI.
//!
//! Three steps, chosen for what they catch per second:
//!
//! 1. `cargo package --no-verify --locked --offline --allow-dirty -p …` for every published
//!    crate at once (a few seconds): a manifest crates.io would refuse, a `readme` or `license-file` that
//!    points to nothing, a path dependency without a version, a lockfile that would change.
//! 2. Each `.crate`'s file list (`tar tzf`): its `Cargo.toml`, its `README.md` and the file
//!    its `readme` key names are in it, and it is under crates.io's 10 MiB.
//! 3. The packaged sources compiled: the `.crate`s are unpacked into
//!    `target/package/check/`, a workspace of their own whose `[patch.crates-io]` points each
//!    packaged crate at its unpacked sibling (so nothing needs crates.io), and each is
//!    `cargo check`ed alone (`-p`, its own features, as a user building it from crates.io
//!    resolves them) into the workspace's own target folder, where clippy already checked
//!    the dependencies. This catches what step 1 cannot: a source file left out of the
//!    package (an `include_str!` or `#[path]` outside the crate's folder, a file excluded),
//!    a feature the crate uses but only a sibling turns on. (A dependency on a crate that is
//!    not published fails here or in step 1, and tidy refuses it first.)
//!
//! `cargo package` with its own verification would catch the same, but it compiles every
//! crate in full (codegen, not a check) once per crate that depends on it. Measured on this
//! 2-core machine (shared, so read the ratios), on a target folder where the workspace was
//! already built and checked: cargo's verification 5 min 12 s the first time and 2 min 2 s
//! on a re-run with nothing changed; this step about 2 min 50 s the first time (the
//! dependencies checked with each crate's own features), 3.5 s with nothing changed, about
//! 40 s after a change to psych-types (every crate checked again). Step 1 alone: 2.8 s.
//! As CI runs it, from a clean target folder right after `cargo clippy --workspace
//! --all-targets` (which took 8 min 22 s): 2 min 52 s. Checking the packages together in
//! one `cargo check --workspace` would take about a quarter of that, but with features
//! unified across them, which is what hides a feature only a sibling turns on.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tidy::{Published, published};

/// crates.io refuses a `.crate` larger than this.
const MAX_CRATE_BYTES: u64 = 10 * 1024 * 1024;

/// Packages every published crate and checks each package, as the module doc describes.
pub(crate) fn package(root: &Path) -> Result<(), String> {
    let metadata = crate::tidy::cargo_metadata(root)?;
    let crates = published(&metadata);
    if crates.is_empty() {
        return Err("no published crate in the workspace".to_owned());
    }
    let target = metadata["target_directory"]
        .as_str()
        .map_or_else(|| root.join("target"), PathBuf::from);
    let out = target.join("package");

    // `--allow-dirty`: what is packaged is the working tree, the one the other CI steps
    // build and test, committed or not.
    let mut args = vec![
        "package",
        "--no-verify",
        "--locked",
        "--offline",
        "--quiet",
        "--allow-dirty",
    ];
    // The missing `repository` is known (there is no public one yet); description and
    // license are tidy's to check.
    args.push("--no-metadata");
    for krate in &crates {
        args.extend(["-p", krate.name.as_str()]);
    }
    crate::cargo(root, &args, &[])?;

    let mut problems = Vec::new();
    for krate in &crates {
        let file = out.join(krate.crate_file());
        let size = std::fs::metadata(&file)
            .map_err(|err| format!("cannot read {}: {err}", file.display()))?
            .len();
        let files = list(&file)?;
        problems.extend(package_files(krate, &files, size));
    }
    if !problems.is_empty() {
        return Err(format!(
            "{} broken package(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        ));
    }

    let check = out.join("check");
    if check.exists() {
        std::fs::remove_dir_all(&check)
            .map_err(|err| format!("cannot remove {}: {err}", check.display()))?;
    }
    std::fs::create_dir_all(&check)
        .map_err(|err| format!("cannot create {}: {err}", check.display()))?;
    for krate in &crates {
        unpack(&out.join(krate.crate_file()), &check)?;
    }
    write(&check.join("Cargo.toml"), &check_workspace(&crates))?;
    std::fs::copy(root.join("Cargo.lock"), check.join("Cargo.lock"))
        .map_err(|err| format!("cannot copy Cargo.lock: {err}"))?;
    let manifest = check.join("Cargo.toml");
    let manifest = manifest.to_string_lossy();
    let target = target.to_string_lossy();
    for krate in &crates {
        crate::cargo(
            root,
            &[
                "check",
                "--quiet",
                "--offline",
                "--manifest-path",
                &manifest,
                "--target-dir",
                &target,
                "-p",
                &krate.name,
            ],
            &[],
        )
        .map_err(|err| format!("the package of {} does not build: {err}", krate.name))?;
    }
    Ok(())
}

/// The files of a `.crate` (a gzipped tar), as `tar` lists them.
fn list(file: &Path) -> Result<Vec<String>, String> {
    let output = Command::new("tar")
        .arg("tzf")
        .arg(file)
        .output()
        .map_err(|err| format!("cannot run tar: {err}"))?;
    if !output.status.success() {
        return Err(format!(
            "tar tzf {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// Unpacks a `.crate` into `dir` (it holds one folder, `<name>-<version>/`), every file
/// given the current time (`--touch`): with the times the `.crate` records, a source
/// changed since the last check could be older than that check's build in the shared
/// target folder, and cargo would take the stale build as fresh (a packaged crate then
/// checked against an older sibling's build: seen as the gateway's package failing on
/// prompt-assembly items added since).
fn unpack(file: &Path, dir: &Path) -> Result<(), String> {
    let status = Command::new("tar")
        .arg("xzf")
        .arg(file)
        .arg("--touch")
        .current_dir(dir)
        .status()
        .map_err(|err| format!("cannot run tar: {err}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("tar xzf {} failed ({status})", file.display()))
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|err| format!("cannot write {}: {err}", path.display()))
}

/// What is wrong with a package, from its file list (`<name>-<version>/…` paths, as the
/// `.crate` holds them) and its size in bytes.
pub(crate) fn package_files(krate: &Published, files: &[String], size: u64) -> Vec<String> {
    let folder = krate.package_folder();
    let has = |path: &str| files.iter().any(|f| f == &format!("{folder}/{path}"));
    let mut problems = Vec::new();
    if !has("Cargo.toml") {
        problems.push(format!("{}: the package has no Cargo.toml", krate.name));
    }
    if !has("README.md") {
        problems.push(format!(
            "{}: the package has no README.md (crates.io shows it as the crate's page)",
            krate.name
        ));
    }
    match &krate.readme {
        Some(readme) if !has(readme) => problems.push(format!(
            "{}: its `readme` ({readme}) is not in the package",
            krate.name
        )),
        Some(_) => {}
        None => problems.push(format!("{}: no `readme` in its Cargo.toml", krate.name)),
    }
    if size > MAX_CRATE_BYTES {
        problems.push(format!(
            "{}: the package is {size} bytes, over crates.io's {MAX_CRATE_BYTES}",
            krate.name
        ));
    }
    problems
}

/// The `Cargo.toml` of the workspace the packages are checked in: each unpacked package a
/// member, and each published crate's registry version patched to its unpacked package.
pub(crate) fn check_workspace(crates: &[Published]) -> String {
    let mut text = String::from(
        "# Written by `cargo xtask package`: the packaged crates, built from their packages.\n\
         [workspace]\nresolver = \"3\"\nmembers = [\n",
    );
    for krate in crates {
        text.push_str(&format!("    \"{}\",\n", krate.package_folder()));
    }
    text.push_str("]\n\n[patch.crates-io]\n");
    for krate in crates {
        text.push_str(&format!(
            "{} = {{ path = \"{}\" }}\n",
            krate.name,
            krate.package_folder()
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A published crate as `cargo metadata` describes it.
    fn published_one(name: &str, readme: Option<&str>) -> Published {
        let metadata = serde_json::json!({"packages": [{
            "name": name, "version": "0.1.0", "publish": null, "readme": readme,
            "manifest_path": format!("/w/{name}/Cargo.toml"),
        }]});
        published(&metadata).remove(0)
    }

    fn files(paths: &[&str]) -> Vec<String> {
        paths.iter().map(|p| format!("psych-a-0.1.0/{p}")).collect()
    }

    #[test]
    fn a_complete_package_passes() {
        let krate = published_one("psych-a", Some("README.md"));
        let all = files(&["Cargo.toml", "Cargo.toml.orig", "README.md", "src/lib.rs"]);
        assert!(package_files(&krate, &all, 1_000).is_empty());
    }

    #[test]
    fn a_package_without_its_readme_or_too_large_fails() {
        let krate = published_one("psych-a", Some("docs/intro.md"));
        let problems = package_files(&krate, &files(&["Cargo.toml", "src/lib.rs"]), 11 << 20);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("no README.md"));
        assert!(problems[1].contains("docs/intro.md"));
        assert!(problems[2].contains("over crates.io's"));

        let unset = published_one("psych-a", None);
        let problems = package_files(&unset, &files(&["Cargo.toml", "README.md"]), 1);
        assert_eq!(problems, ["psych-a: no `readme` in its Cargo.toml"]);
    }

    #[test]
    fn the_check_workspace_patches_every_package() {
        let crates = [
            published_one("psych-a", None),
            published_one("psych-b", None),
        ];
        let text = check_workspace(&crates);
        assert!(text.contains("members = [\n    \"psych-a-0.1.0\",\n    \"psych-b-0.1.0\",\n]"));
        assert!(
            text.contains("psych-b = { path = \"psych-b-0.1.0\" }"),
            "{text}"
        );
    }
}
