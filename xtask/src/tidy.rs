//! Tidy checks: the conventions of DESIGN.md and STYLE.md that matter enough to be tests.
//!
//! Each check is a function from plain inputs (`cargo metadata` JSON, file paths and
//! contents) to a list of violations, so that it can be tested on a made-up violation as well
//! as run on the real workspace. `cargo xtask ci` runs them first; `cargo test` runs them too.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The core crates, which may depend on no workspace crate but `psych-types`.
pub(crate) const CORE_CRATES: [&str; 7] = [
    "psych-catalog",
    "psych-disclosure",
    "psych-elision",
    "psych-record-log",
    "psych-reader-tool",
    "psych-prompt-assembly",
    "psych-store-postgres",
];

/// The one workspace crate the core crates may depend on.
const SHARED_TYPES: &str = "psych-types";

/// crates.io's category slugs (its `src/boot/categories.toml`, read in December 2026): a
/// slug outside this list is dropped by crates.io with only a warning, so tidy refuses it.
const CRATES_IO_CATEGORIES: &[&str] = &[
    "algorithms",
    "api-bindings",
    "asynchronous",
    "authentication",
    "caching",
    "command-line-interface",
    "command-line-utilities",
    "compression",
    "computer-vision",
    "concurrency",
    "config",
    "cryptography",
    "cryptography::cryptocurrencies",
    "data-structures",
    "database",
    "database-implementations",
    "date-and-time",
    "development-tools",
    "development-tools::build-utils",
    "development-tools::cargo-plugins",
    "development-tools::debugging",
    "development-tools::ffi",
    "development-tools::procedural-macro-helpers",
    "development-tools::profiling",
    "development-tools::testing",
    "email",
    "embedded",
    "emulators",
    "encoding",
    "external-ffi-bindings",
    "filesystem",
    "game-development",
    "game-engines",
    "games",
    "graphics",
    "gui",
    "hardware-support",
    "internationalization",
    "localization",
    "mathematics",
    "memory-management",
    "multimedia",
    "multimedia::audio",
    "multimedia::encoding",
    "multimedia::images",
    "multimedia::video",
    "network-programming",
    "no-std",
    "os",
    "os::linux-apis",
    "os::macos-apis",
    "os::unix-apis",
    "os::windows-apis",
    "parser-implementations",
    "parsing",
    "rendering",
    "rendering::data-formats",
    "rendering::engine",
    "rendering::graphics-api",
    "rust-patterns",
    "science",
    "science::robotics",
    "simulation",
    "template-engine",
    "text-editors",
    "text-processing",
    "value-formatting",
    "visualization",
    "wasm",
    "web-programming",
    "web-programming::http-client",
    "web-programming::http-server",
    "web-programming::websocket",
];

/// crates.io takes at most this many keywords, and as many categories.
const MAX_KEYWORDS: usize = 5;

/// Runs every tidy check on the workspace at `root`; returns the violations found.
pub(crate) fn run_all(root: &Path) -> Result<Vec<String>, String> {
    let metadata = cargo_metadata(root)?;
    let mut violations = dependency_rule(&metadata);
    violations.extend(internal_deps_have_versions(&metadata));
    violations.extend(published_depend_on_published(&metadata));
    for krate in published(&metadata) {
        let exists = |file: &str| krate.dir.join(file).is_file();
        violations.extend(publish_metadata(&krate, exists));
        violations.extend(readme_example(root, &krate)?);
    }
    violations.extend(no_order_preserving_json(&resolved_metadata(root)?));
    violations.extend(runtime_without_mcp_client(&runtime_tree(root)?));
    violations.extend(integration_tests_in_workspace(&metadata)?);
    let files = rust_files(root)?;
    for path in &files {
        let text = std::fs::read_to_string(path)
            .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        let shown = path.strip_prefix(root).unwrap_or(path);
        violations.extend(module_doc(shown, &text));
        violations.extend(no_ignore(shown, &text));
    }
    Ok(violations)
}

/// `cargo metadata` of the workspace, without dependencies' own packages (needs nothing
/// downloaded, so it runs offline).
pub(crate) fn cargo_metadata(root: &Path) -> Result<Value, String> {
    metadata(root, &["--no-deps", "--offline"])
}

/// `cargo metadata` with the resolved dependency graph and its features. Not offline: the
/// graph names every platform's crates (TLS pulls in Windows and macOS ones), which a
/// build on this platform never downloads; `--locked` keeps the lockfile as committed.
fn resolved_metadata(root: &Path) -> Result<Value, String> {
    metadata(root, &["--locked"])
}

fn metadata(root: &Path, extra: &[&str]) -> Result<Value, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .args(extra)
        .current_dir(root)
        .output()
        .map_err(|err| format!("cannot run cargo metadata: {err}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|err| format!("cargo metadata output: {err}"))
}

/// The workspace's packages as `(name, dependencies)` pairs.
fn packages(metadata: &Value) -> impl Iterator<Item = (&str, &[Value])> {
    metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|package| {
            let name = package["name"].as_str().unwrap_or("?");
            let deps = package["dependencies"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            (name, deps)
        })
}

/// Names of the workspace's own packages.
fn workspace_names(metadata: &Value) -> Vec<&str> {
    packages(metadata).map(|(name, _)| name).collect()
}

/// The dependency rule of DESIGN.md: a core crate depends on no other workspace crate but
/// `psych-types`, in any dependency kind (normal, dev or build), so each can be picked alone;
/// the one exception is a dev-dependency on a test fixture crate (`publish = false`, by path
/// only, so `cargo package` drops it) that uses no workspace crate but `psych-types` and the
/// core crate itself, as rust-analyzer's crates use its `test-utils`.
pub(crate) fn dependency_rule(metadata: &Value) -> Vec<String> {
    let ours = workspace_names(metadata);
    let unpublished = unpublished_names(metadata);
    // What each workspace crate depends on in the workspace (normal dependencies).
    let uses = |crate_name: &str| -> Vec<&str> {
        packages(metadata)
            .filter(|(name, _)| *name == crate_name)
            .flat_map(|(_, deps)| deps)
            .filter(|dep| dep["kind"].is_null())
            .filter_map(|dep| dep["name"].as_str())
            .filter(|dep| ours.contains(dep))
            .collect()
    };
    let mut violations = Vec::new();
    for (name, deps) in packages(metadata) {
        if !CORE_CRATES.contains(&name) {
            continue;
        }
        for dep in deps {
            let dep_name = dep["name"].as_str().unwrap_or("?");
            let kind = dep["kind"].as_str().unwrap_or("normal");
            // A test fixture crate (not published) for this core crate's tests: its package
            // drops it, and it ties the core crate to nothing else (it uses no workspace
            // crate but psych-types and this one).
            let fixture = kind == "dev"
                && unpublished.contains(&dep_name)
                && uses(dep_name)
                    .iter()
                    .all(|used| *used == SHARED_TYPES || *used == name);
            if fixture {
                continue;
            }
            if dep_name != SHARED_TYPES && ours.contains(&dep_name) {
                violations.push(format!(
                    "dependency rule: core crate {name} depends on {dep_name} ({kind}); core \
                     crates may depend on {SHARED_TYPES} only (DESIGN.md, workspace layout): \
                     move the seam into {SHARED_TYPES} or the composition into psych-runtime"
                ));
            }
        }
    }
    violations
}

/// Internal (path) dependencies give a version too, so each crate stays publishable alone.
/// The one exception is a dev-dependency on a crate that is not published (a test fixture
/// crate): it must have no version, so that `cargo package` drops it (see
/// [`published_depend_on_published`]).
pub(crate) fn internal_deps_have_versions(metadata: &Value) -> Vec<String> {
    let unpublished = unpublished_names(metadata);
    let mut violations = Vec::new();
    for (name, deps) in packages(metadata) {
        for dep in deps {
            let has_path = dep.get("path").is_some_and(|p| !p.is_null());
            let req = dep["req"].as_str().unwrap_or("*");
            let dep_name = dep["name"].as_str().unwrap_or("?");
            let dev_fixture = dep["kind"] == "dev" && unpublished.contains(&dep_name);
            if has_path && req == "*" && !dev_fixture {
                violations.push(format!(
                    "internal dependency without version: {name} depends on {} by path only; \
                     give it `version` as well",
                    dep["name"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    violations
}

/// A workspace crate that is published (its manifest has no `publish = false`), as
/// `cargo metadata` describes it.
#[derive(Debug)]
pub(crate) struct Published {
    /// The package name (`psych-types`).
    pub(crate) name: String,
    /// Its version (`0.1.0`).
    pub(crate) version: String,
    /// The folder of its `Cargo.toml`.
    pub(crate) dir: PathBuf,
    /// Its `readme` file, relative to `dir` (cargo fills in `README.md` when the key is
    /// absent and the file exists).
    pub(crate) readme: Option<String>,
    /// Its description, if any.
    pub(crate) description: Option<String>,
    /// Its crates.io keywords.
    pub(crate) keywords: Vec<String>,
    /// Its crates.io category slugs.
    pub(crate) categories: Vec<String>,
}

impl Published {
    /// The folder its `.crate` unpacks to: `<name>-<version>`.
    pub(crate) fn package_folder(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }

    /// The file `cargo package` writes: `<name>-<version>.crate`.
    pub(crate) fn crate_file(&self) -> String {
        format!("{}.crate", self.package_folder())
    }
}

/// Whether `cargo metadata` says a package may be published: `publish` is null (anywhere)
/// or a non-empty list of registries; `publish = false` is an empty list.
fn is_published(package: &Value) -> bool {
    package["publish"]
        .as_array()
        .is_none_or(|registries| !registries.is_empty())
}

/// The workspace's published crates, in `cargo metadata`'s order.
pub(crate) fn published(metadata: &Value) -> Vec<Published> {
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|package| is_published(package))
        .map(|package| {
            let manifest = Path::new(package["manifest_path"].as_str().unwrap_or(""));
            Published {
                name: package["name"].as_str().unwrap_or("?").to_owned(),
                version: package["version"].as_str().unwrap_or("?").to_owned(),
                dir: manifest.parent().unwrap_or(manifest).to_path_buf(),
                readme: package["readme"].as_str().map(str::to_owned),
                description: package["description"].as_str().map(str::to_owned),
                keywords: strings(&package["keywords"]),
                categories: strings(&package["categories"]),
            }
        })
        .collect()
}

/// Names of the workspace's packages with `publish = false`.
fn unpublished_names(metadata: &Value) -> Vec<&str> {
    metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|package| !is_published(package))
        .filter_map(|package| package["name"].as_str())
        .collect()
}

/// A published crate carries what crates.io shows: a description, a `README.md` in its
/// folder that its `readme` key names, 1 to 5 keywords in crates.io's alphabet and 1 to 5
/// of crates.io's category slugs. `exists` says whether a file (relative to the crate's
/// folder) is there.
pub(crate) fn publish_metadata(krate: &Published, exists: impl Fn(&str) -> bool) -> Vec<String> {
    let name = &krate.name;
    let mut violations = Vec::new();
    if krate
        .description
        .as_deref()
        .is_none_or(|d| d.trim().is_empty())
    {
        violations.push(format!("publish: {name} has no `description`"));
    }
    if !exists("README.md") {
        violations.push(format!(
            "publish: {name} has no README.md in its folder (what it is for, an example, its \
             place among the other crates)"
        ));
    }
    match krate.readme.as_deref() {
        None => violations.push(format!("publish: {name} has no `readme` in its Cargo.toml")),
        Some(readme) if !exists(readme) => violations.push(format!(
            "publish: {name}'s `readme = \"{readme}\"` names a file that does not exist"
        )),
        Some(_) => {}
    }
    if krate.keywords.is_empty() || krate.keywords.len() > MAX_KEYWORDS {
        violations.push(format!(
            "publish: {name} has {} keywords; crates.io wants 1 to {MAX_KEYWORDS}",
            krate.keywords.len()
        ));
    }
    for keyword in &krate.keywords {
        if !valid_keyword(keyword) {
            violations.push(format!(
                "publish: {name}'s keyword \"{keyword}\" is not one crates.io takes (at most \
                 20 characters, ASCII letters, digits, `_`, `-`, `+`, starting with a letter or \
                 digit)"
            ));
        }
    }
    if krate.categories.is_empty() || krate.categories.len() > MAX_KEYWORDS {
        violations.push(format!(
            "publish: {name} has {} categories; crates.io wants 1 to {MAX_KEYWORDS}",
            krate.categories.len()
        ));
    }
    for category in &krate.categories {
        if !CRATES_IO_CATEGORIES.contains(&category.as_str()) {
            violations.push(format!(
                "publish: {name}'s category \"{category}\" is not a crates.io category slug \
                 (crates.io would drop it)"
            ));
        }
    }
    violations
}

/// crates.io's keyword rule: 1 to 20 ASCII characters, letters, digits, `_`, `-` or `+`,
/// the first a letter or digit.
fn valid_keyword(keyword: &str) -> bool {
    let mut chars = keyword.chars();
    keyword.len() <= 20
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+'))
}

/// No published crate depends on one that is not published: a user of the first could not
/// build it. A dev-dependency on an unpublished crate (a test fixture crate) is allowed
/// only without a version, so that `cargo package` drops it from the published manifest.
pub(crate) fn published_depend_on_published(metadata: &Value) -> Vec<String> {
    let unpublished = unpublished_names(metadata);
    let mut violations = Vec::new();
    for krate in published(metadata) {
        let deps = packages(metadata)
            .find(|(name, _)| *name == krate.name)
            .map(|(_, deps)| deps)
            .unwrap_or_default();
        for dep in deps {
            let dep_name = dep["name"].as_str().unwrap_or("?");
            if !unpublished.contains(&dep_name) {
                continue;
            }
            let kind = dep["kind"].as_str().unwrap_or("normal");
            let versioned = dep["req"].as_str().unwrap_or("*") != "*";
            if kind != "dev" {
                violations.push(format!(
                    "publish: {} is published but depends on {dep_name} ({kind}), which has \
                     `publish = false`: move what it needs into a published crate",
                    krate.name
                ));
            } else if versioned {
                violations.push(format!(
                    "publish: {} is published and dev-depends on {dep_name} (`publish = \
                     false`) with a version; give it `path` only, so `cargo package` drops it",
                    krate.name
                ));
            }
        }
    }
    violations
}

/// The README example of a published crate with a `lib.rs` example is that example
/// ([`crate::readme`]).
fn readme_example(root: &Path, krate: &Published) -> Result<Option<String>, String> {
    let lib = krate.dir.join("src/lib.rs");
    let readme = krate.dir.join("README.md");
    if !lib.is_file() || !readme.is_file() {
        return Ok(None);
    }
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .map_err(|err| format!("cannot read {}: {err}", path.display()))
    };
    let shown = krate.dir.strip_prefix(root).unwrap_or(&krate.dir);
    Ok(crate::readme::example_matches(
        shown,
        &read(&lib)?,
        &read(&readme)?,
    ))
}

/// serde_json's `preserve_order` feature is never on in the build. Without it a JSON object
/// is a sorted map, and several crates rely on that for byte-stable output (the JSON text
/// view of a tool output that the model sees, the log stores and the reader pages). Cargo
/// unifies features, so one crate turning it on would silently change every other crate's
/// bytes.
pub(crate) fn no_order_preserving_json(resolved: &Value) -> Vec<String> {
    resolved["resolve"]["nodes"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|node| node["id"].as_str().unwrap_or("").contains("serde_json@"))
        .filter(|node| {
            node["features"]
                .as_array()
                .is_some_and(|features| features.iter().any(|f| f == "preserve_order"))
        })
        .map(|node| {
            format!(
                "serde_json is built with preserve_order ({}): JSON object keys would follow \
                 insertion order and break byte-stable output; turn the feature off",
                node["id"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// The crates psych-runtime must not build with its default features: an MCP client and
/// the HTTP stack under it. A Run user with their own MCP client, or none, compiles none of
/// them; psych-mcp's glue (`CatalogSync`) is behind the feature `mcp`.
const NOT_IN_RUNTIME: [&str; 4] = ["psych-mcp", "rmcp", "hyper", "reqwest"];

/// `cargo tree -p psych-runtime -e normal --prefix none`: the crates a user of
/// psych-runtime with its default features compiles, one per line (`name vX.Y.Z ...`).
fn runtime_tree(root: &Path) -> Result<String, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["tree", "-p", "psych-runtime", "-e", "normal"])
        .args(["--prefix", "none"])
        .args(["--locked", "--offline"])
        .current_dir(root)
        .output()
        .map_err(|err| format!("cannot run cargo tree: {err}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo tree failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    String::from_utf8(output.stdout).map_err(|err| format!("cargo tree output: {err}"))
}

/// psych-runtime with its default features depends on none of [`NOT_IN_RUNTIME`], in its
/// normal dependency tree (`tree` is [`runtime_tree`]'s output).
pub(crate) fn runtime_without_mcp_client(tree: &str) -> Vec<String> {
    let mut found: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| NOT_IN_RUNTIME.contains(name))
        .collect();
    found.sort_unstable();
    found.dedup();
    found
        .into_iter()
        .map(|name| {
            format!(
                "psych-runtime builds {name} with its default features (`cargo tree -p \
                 psych-runtime -e normal -i {name}` says through what): a Run user without \
                 our MCP client must not compile it; put what needs it behind the feature `mcp`"
            )
        })
        .collect()
}

/// Runs [`integration_tests_compiled`] on every workspace package with a `tests/` folder.
fn integration_tests_in_workspace(metadata: &Value) -> Result<Vec<String>, String> {
    let mut violations = Vec::new();
    for package in metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let name = package["name"].as_str().unwrap_or("?");
        let Some(dir) = package["manifest_path"]
            .as_str()
            .and_then(|m| Path::new(m).parent())
        else {
            continue;
        };
        let tests = dir.join("tests");
        if !tests.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&tests)
            .map_err(|err| format!("cannot list {}: {err}", tests.display()))?
        {
            let entry = entry.map_err(|err| format!("cannot list {}: {err}", tests.display()))?;
            let file = entry.file_name().to_string_lossy().into_owned();
            if let Some(stem) = file.strip_suffix(".rs") {
                files.push(stem.to_owned());
            }
        }
        files.sort();
        let mut roots = Vec::new();
        let targets = package["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        for target in targets {
            let is_test = target["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|kind| kind == "test"));
            let Some(path) = target["src_path"].as_str().map(Path::new) else {
                continue;
            };
            if !is_test || path.parent() != Some(tests.as_path()) {
                continue;
            }
            let text = std::fs::read_to_string(path)
                .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            roots.push((stem.unwrap_or_default(), text));
        }
        violations.extend(integration_tests_compiled(name, &files, &roots));
    }
    Ok(violations)
}

/// One integration-test binary per crate (`tests/it.rs`, with `autotests = false`; why: see
/// ARCHITECTURE.md, `xtask/`). Cargo then compiles
/// only the `[[test]]` targets, so a `tests/*.rs` file (by stem, in `files`) that is neither a
/// test target's root nor declared `mod <stem>;` by one (`roots`: stem and text of each test
/// target directly in `tests/`) would never run; it is refused instead.
pub(crate) fn integration_tests_compiled(
    package: &str,
    files: &[String],
    roots: &[(String, String)],
) -> Vec<String> {
    files
        .iter()
        .filter(|file| {
            let declared = format!("mod {file};");
            !roots.iter().any(|(stem, text)| {
                stem == *file || text.lines().any(|line| line.trim() == declared)
            })
        })
        .map(|file| {
            format!(
                "integration test never compiled: {package}'s tests/{file}.rs is no test \
                 target and no module of one; add `mod {file};` to tests/it.rs (or a \
                 `[[test]]` target, if it needs a process of its own)"
            )
        })
        .collect()
}

/// Every Rust module opens with a `//!` doc comment saying what it is for.
pub(crate) fn module_doc(path: &Path, text: &str) -> Option<String> {
    let first = text.lines().map(str::trim).find(|line| !line.is_empty());
    match first {
        Some(line) if line.starts_with("//!") => None,
        _ => Some(format!(
            "module without doc: {} does not open with a `//!` comment",
            path.display()
        )),
    }
}

/// No test is ignored: assert today's wrong behaviour and say why instead.
pub(crate) fn no_ignore(path: &Path, text: &str) -> Vec<String> {
    // Spelled in two pieces so this file does not match itself.
    let needle = concat!("#[", "ignore");
    text.lines()
        .enumerate()
        .filter(|(_, line)| line.contains(needle))
        .map(|(i, _)| {
            format!(
                "ignored test: {}:{} uses {needle}]; never ignore a test",
                path.display(),
                i + 1
            )
        })
        .collect()
}

/// Every `.rs` file of the workspace, outside `target/` and hidden folders, sorted.
pub(crate) fn rust_files(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|err| format!("cannot list {}: {err}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|err| format!("cannot list {}: {err}", dir.display()))?;
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    /// A made-up `cargo metadata` with one core crate depending on the given crates.
    fn metadata_with(core: &str, deps: &[(&str, Option<&str>, &str)]) -> Value {
        let deps: Vec<Value> = deps
            .iter()
            .map(|(name, path, req)| {
                serde_json::json!({"name": name, "path": path, "req": req, "kind": null})
            })
            .collect();
        serde_json::json!({"packages": [
            {"name": core, "dependencies": deps},
            {"name": "psych-types", "dependencies": []},
            {"name": "psych-elision", "dependencies": []},
            {"name": "psych-runtime", "dependencies": []},
        ]})
    }

    #[test]
    fn the_workspace_is_tidy() {
        let violations = run_all(&root()).unwrap();
        assert!(violations.is_empty(), "{}", violations.join("\n"));
    }

    #[test]
    fn every_core_crate_is_a_workspace_member() {
        let metadata = cargo_metadata(&root()).unwrap();
        let names = workspace_names(&metadata);
        for core in CORE_CRATES {
            assert!(names.contains(&core), "{core} missing from {names:?}");
        }
    }

    #[test]
    fn dependency_rule_names_both_crates() {
        let bad = metadata_with(
            "psych-disclosure",
            &[
                ("psych-types", Some("/w/types"), "^0.1.0"),
                ("psych-elision", Some("/w/elision"), "^0.1.0"),
                ("serde", None, "^1"),
            ],
        );
        let violations = dependency_rule(&bad);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("psych-disclosure depends on psych-elision"));
    }

    #[test]
    fn dependency_rule_allows_types_and_external_crates_and_leaves_the_runtime_alone() {
        let good = metadata_with(
            "psych-elision",
            &[
                ("psych-types", Some("/w/types"), "^0.1.0"),
                ("memchr", None, "^2"),
            ],
        );
        assert!(dependency_rule(&good).is_empty());
        let runtime = metadata_with("psych-runtime", &[("psych-elision", Some("/w"), "^0.1.0")]);
        assert!(dependency_rule(&runtime).is_empty());
    }

    #[test]
    fn dependency_rule_allows_a_test_fixture_crate_to_a_core_crates_tests_only() {
        let metadata = |kind: Option<&str>, fixture_uses: &str| {
            serde_json::json!({"packages": [
                {"name": "psych-prompt-assembly", "publish": null, "dependencies": [
                    {"name": "psych-test-support", "path": "/w/tsup", "req": "*", "kind": kind},
                ]},
                {"name": "psych-test-support", "publish": [], "dependencies": [
                    {"name": fixture_uses, "path": "/w/x", "req": "^0.1.0", "kind": null},
                ]},
                {"name": "psych-elision", "publish": null, "dependencies": []},
            ]})
        };
        // A fixture using the core crate itself: allowed to its tests.
        let own = "psych-prompt-assembly";
        assert!(dependency_rule(&metadata(Some("dev"), own)).is_empty());
        // As a normal dependency: refused.
        let normal = dependency_rule(&metadata(None, own));
        assert_eq!(normal.len(), 1, "{normal:?}");
        assert!(normal[0].contains("psych-prompt-assembly depends on psych-test-support"));
        // A fixture that ties in another core crate: refused even for tests.
        let other = dependency_rule(&metadata(Some("dev"), "psych-elision"));
        assert_eq!(other.len(), 1, "{other:?}");
    }

    #[test]
    fn path_only_internal_dependencies_are_refused() {
        let bad = metadata_with("psych-elision", &[("psych-types", Some("/w/types"), "*")]);
        let violations = internal_deps_have_versions(&bad);
        assert_eq!(violations.len(), 1);
        assert!(violations[0].contains("psych-elision depends on psych-types"));
        let good = metadata_with(
            "psych-elision",
            &[("psych-types", Some("/w/types"), "^0.1.0")],
        );
        assert!(internal_deps_have_versions(&good).is_empty());
    }

    /// A published crate with the given metadata, as `cargo metadata` describes it.
    fn crate_with(readme: Option<&str>, keywords: &[&str], categories: &[&str]) -> Published {
        let metadata = serde_json::json!({"packages": [{
            "name": "psych-a", "version": "0.1.0", "publish": null,
            "manifest_path": "/w/a/Cargo.toml", "description": "A crate.",
            "readme": readme, "keywords": keywords, "categories": categories,
        }]});
        published(&metadata).remove(0)
    }

    #[test]
    fn complete_publish_metadata_passes() {
        let good = crate_with(
            Some("README.md"),
            &["mcp", "llm", "c++", "a_b"],
            &["caching"],
        );
        assert!(publish_metadata(&good, |_| true).is_empty());
    }

    #[test]
    fn missing_readme_and_bad_keywords_and_categories_are_refused() {
        let no_file = crate_with(Some("README.md"), &["mcp"], &["caching"]);
        let violations = publish_metadata(&no_file, |_| false);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].contains("no README.md in its folder"));
        assert!(violations[1].contains("names a file that does not exist"));

        let no_key = crate_with(None, &["mcp"], &["caching"]);
        let violations = publish_metadata(&no_key, |_| true);
        assert_eq!(
            violations,
            ["publish: psych-a has no `readme` in its Cargo.toml"]
        );

        let six = ["a", "b", "c", "d", "e", "f"];
        let bad = crate_with(
            Some("README.md"),
            &six,
            &["ai", "development-tools::testing", "command-line-utilities"],
        );
        let violations = publish_metadata(&bad, |_| true);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].contains("6 keywords"));
        assert!(violations[1].contains("\"ai\" is not a crates.io category"));

        let spelled = crate_with(
            Some("README.md"),
            &["two words", "-dash", "twenty-one-characters", "ok"],
            &[],
        );
        let violations = publish_metadata(&spelled, |_| true);
        assert_eq!(violations.len(), 4, "{violations:?}");
        assert!(
            violations[..3]
                .iter()
                .all(|v| v.contains("is not one crates.io takes"))
        );
        assert!(violations[3].contains("0 categories"));
    }

    #[test]
    fn a_published_crate_may_not_depend_on_an_unpublished_one() {
        let metadata = |kind: Option<&str>, req: &str| {
            serde_json::json!({"packages": [
                {"name": "psych-cli", "publish": null, "dependencies": [
                    {"name": "psych-test-server", "path": "/w/ts", "req": req, "kind": kind},
                ]},
                {"name": "psych-test-server", "publish": [], "dependencies": []},
                {"name": "psych-tests", "publish": [], "dependencies": [
                    {"name": "psych-test-server", "path": "/w/ts", "req": "^0.1.0", "kind": null},
                ]},
            ]})
        };
        let normal = published_depend_on_published(&metadata(None, "^0.1.0"));
        assert_eq!(normal.len(), 1, "{normal:?}");
        assert!(normal[0].contains("psych-cli is published but depends on psych-test-server"));
        let build = published_depend_on_published(&metadata(Some("build"), "^0.1.0"));
        assert!(build[0].contains("(build)"), "{build:?}");

        let dev_versioned = published_depend_on_published(&metadata(Some("dev"), "^0.1.0"));
        assert_eq!(dev_versioned.len(), 1, "{dev_versioned:?}");
        assert!(dev_versioned[0].contains("give it `path` only"));

        // A path-only dev-dependency is dropped by `cargo package`: allowed by both rules.
        let dev_path = metadata(Some("dev"), "*");
        assert!(published_depend_on_published(&dev_path).is_empty());
        assert!(internal_deps_have_versions(&dev_path).is_empty());
        // A path-only normal dependency is still refused for its missing version.
        assert_eq!(internal_deps_have_versions(&metadata(None, "*")).len(), 1);
    }

    #[test]
    fn the_published_crates_are_the_libraries() {
        let metadata = cargo_metadata(&root()).unwrap();
        let mut names: Vec<String> = published(&metadata).into_iter().map(|c| c.name).collect();
        names.sort();
        for expected in CORE_CRATES.iter().chain(&[
            "psych-types",
            "psych-runtime",
            "psych-mcp",
            "psych-gateway",
        ]) {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} not in {names:?}"
            );
        }
        // The cli's embedded servers are the test server, a fixture.
        for unpublished in ["xtask", "psych-tests", "psych-test-server", "psych-cli"] {
            assert!(!names.iter().any(|n| n == unpublished), "{names:?}");
        }
    }

    #[test]
    fn order_preserving_json_is_refused() {
        let node = |features: Value| {
            serde_json::json!({"resolve": {"nodes": [
                {"id": "registry+https://github.com/rust-lang/crates.io-index#serde_json@1.0.1",
                 "features": features},
                {"id": "registry+https://github.com/rust-lang/crates.io-index#indexmap@2.0.0",
                 "features": ["preserve_order"]},
            ]}})
        };
        let bad = no_order_preserving_json(&node(serde_json::json!(["std", "preserve_order"])));
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("serde_json is built with preserve_order"));
        assert!(no_order_preserving_json(&node(serde_json::json!(["std"]))).is_empty());
    }

    #[test]
    fn the_build_resolves_serde_json_without_preserve_order() {
        let resolved = resolved_metadata(&root()).unwrap();
        let nodes = resolved["resolve"]["nodes"].as_array().unwrap();
        assert!(
            nodes
                .iter()
                .any(|n| n["id"].as_str().unwrap().contains("serde_json@")),
            "serde_json must be in the resolved graph for this check to mean anything"
        );
        assert!(no_order_preserving_json(&resolved).is_empty());
    }

    #[test]
    fn an_mcp_client_in_the_runtime_is_refused() {
        let tree = "psych-runtime v0.1.0 (/w/runtime)\npsych-types v0.1.0 (/w/types)\n\
                    rmcp v3.11.0\nhyper v1.8.1\nhyper-util v0.1.19\nrmcp v3.11.0\n";
        let bad = runtime_without_mcp_client(tree);
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].contains("builds hyper "), "{}", bad[0]);
        assert!(bad[1].contains("builds rmcp "), "{}", bad[1]);
        let clean = "psych-runtime v0.1.0 (/w/runtime)\ntokio v1.48.0\nhyper-util v0.1.19\n";
        assert!(runtime_without_mcp_client(clean).is_empty());
    }

    #[test]
    fn the_runtime_builds_without_an_mcp_client() {
        let tree = runtime_tree(&root()).unwrap();
        assert!(
            tree.lines().any(|line| line.starts_with("psych-types ")),
            "the tree must list the runtime's dependencies for this check to mean anything"
        );
        let bad = runtime_without_mcp_client(&tree);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn modules_must_open_with_a_doc_comment() {
        let path = Path::new("x/src/a.rs");
        assert!(module_doc(path, "//! What it is.\nfn f() {}\n").is_none());
        assert!(module_doc(path, "\n\n//! After blank lines.\n").is_none());
        assert!(module_doc(path, "// a plain comment\n//! late\n").is_some());
        assert!(module_doc(path, "use std::fs;\n").is_some());
        assert!(module_doc(path, "").is_some());
    }

    #[test]
    fn ignored_tests_are_found() {
        let path = Path::new("x/tests/t.rs");
        let text = format!(
            "//! t\n#[test]\n{}]\nfn slow() {{}}\n",
            concat!("#[", "ignore")
        );
        let violations = no_ignore(path, &text);
        assert_eq!(violations.len(), 1);
        assert!(violations[0].contains("x/tests/t.rs:3"), "{violations:?}");
        assert!(no_ignore(path, "//! t\n#[test]\nfn fast() {}\n").is_empty());
    }

    #[test]
    fn a_test_file_no_binary_compiles_is_refused() {
        let files = [
            "alone".to_owned(),
            "cli".to_owned(),
            "it".to_owned(),
            "lost".to_owned(),
        ];
        let roots = [
            ("it".to_owned(), "//! doc\n\nmod cli;\n".to_owned()),
            ("alone".to_owned(), "//! doc\n".to_owned()),
        ];
        let violations = integration_tests_compiled("psych-x", &files, &roots);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("tests/lost.rs"), "{violations:?}");
    }
}
