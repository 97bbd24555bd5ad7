//! Every tool definition of the real catalogues in `../shared/fixtures/catalogs/` survives a
//! parse and a serialize unchanged, compared as JSON values.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::path::PathBuf;

use psych_types::ToolList;
use serde_json::Value;

/// The `shared/fixtures/catalogs` folder beside the checkout (or `$PSYCH_FIXTURES/catalogs`).
fn catalogs_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PSYCH_FIXTURES") {
        return PathBuf::from(dir).join("catalogs");
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .map(|dir| dir.join("shared/fixtures/catalogs"))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| panic!("no shared/fixtures/catalogs above {}", manifest.display()))
}

#[test]
fn every_fixture_tool_round_trips_field_for_field() {
    let mut files = std::fs::read_dir(catalogs_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect::<Vec<_>>();
    files.sort();
    assert_eq!(
        files.len(),
        6,
        "expected the six fixture catalogues: {files:?}"
    );
    let mut tools = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let original: Value = serde_json::from_str(&text).unwrap();
        let list: ToolList =
            serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        for (tool, original) in list.tools.iter().zip(original["tools"].as_array().unwrap()) {
            let back = serde_json::to_value(tool).unwrap();
            assert_eq!(&back, original, "{}: {}", path.display(), tool.name);
            tools += 1;
        }
        assert_eq!(
            serde_json::to_value(&list).unwrap(),
            original,
            "{}",
            path.display()
        );
    }
    assert_eq!(tools, 117 + 117 + 24 + 25 + 14 + 9);
}

#[test]
fn the_full_github_catalogue_keeps_icons_and_meta_typed() {
    let text = std::fs::read_to_string(catalogs_dir().join("github.tools.full.json")).unwrap();
    let list: ToolList = serde_json::from_str(&text).unwrap();
    let with_icons = list.tools.iter().filter(|t| t.icons.is_some()).count();
    let with_meta = list.tools.iter().filter(|t| t.meta.is_some()).count();
    assert_eq!((with_icons, with_meta), (6, 5));
    assert!(list.tools.iter().all(|t| t.extra.is_empty()));
}
