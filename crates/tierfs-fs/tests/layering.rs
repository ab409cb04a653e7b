//! The core's shape, checked on its source (issue 12): the parts depend on each other one
//! way only (no cycle between the crate's top-level modules, counting a directory module as
//! one), nothing imports the `fs` dispatcher, and no source file grows past `MAX_LINES`.
//! A reference is a path `crate::name` anywhere in a file (a `use` or inline); a name the
//! crate root re-exports (`crate::KernelCache`) counts as the module it comes from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`data/read.rs` -> `data`); None for lib.rs.
fn module_of(p: &Path) -> Option<String> {
    let rel = p.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(m) => Some(m.to_string()),
        None => Some(first),
    }
}

/// Names the crate root re-exports, and from which module (`pub use served::KernelCache;`).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in lib.split(';') {
        let s = stmt.trim();
        let Some(rest) = s.strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for n in names.split(',') {
            let n = n.trim().rsplit("::").next().unwrap_or("").to_string();
            if !n.is_empty() {
                out.insert(n, module.trim().to_string());
            }
        }
    }
    out
}

/// The modules `text` refers to through `crate::`.
fn references(
    text: &str,
    modules: &BTreeSet<String>,
    reexp: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        if text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `tierfs_cache::` etc.
        }
        let rest = &text[i + "crate::".len()..];
        let mut names: Vec<&str> = Vec::new();
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b::Y};`
            let end = group.find('}').unwrap_or(group.len());
            names.extend(group[..end].split(',').map(|s| s.trim()));
        } else {
            names.push(rest);
        }
        for n in names {
            let head: String = n
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if modules.contains(&head) {
                out.insert(head);
            } else if let Some(m) = reexp.get(&head) {
                out.insert(m.clone());
            }
        }
    }
    out
}

#[test]
fn modules_depend_one_way_and_files_stay_small() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let reexp = reexports(&lib);
    let modules: BTreeSet<String> = files.iter().filter_map(|p| module_of(p)).collect();
    assert!(modules.len() > 10, "found only {modules:?}");
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut long = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines = text.lines().count();
        if lines > MAX_LINES {
            long.push(format!("{} ({lines} lines)", f.display()));
        }
        let Some(m) = module_of(f) else { continue };
        let refs = references(&text, &modules, &reexp);
        deps.entry(m.clone())
            .or_default()
            .extend(refs.into_iter().filter(|r| *r != m));
    }
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
    let importers: Vec<&String> = deps
        .iter()
        .filter(|(_, d)| d.contains("fs"))
        .map(|(m, _)| m)
        .collect();
    assert!(
        importers.is_empty(),
        "the fs dispatcher is imported by {importers:?}"
    );
    // A cycle: a module that reaches itself.
    for start in deps.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((m, path)) = stack.pop() {
            for d in deps.get(&m).into_iter().flatten() {
                if d == start {
                    panic!("import cycle: {} -> {d}", path.join(" -> "));
                }
                if seen.insert(d.clone()) {
                    let mut p = path.clone();
                    p.push(d.clone());
                    stack.push((d.clone(), p));
                }
            }
        }
    }
    // The parts sit where the architecture says (docs/architecture.md).
    let reaches = |a: &str, b: &str| deps.get(a).is_some_and(|d| d.contains(b));
    assert!(reaches("data", "namespace"), "{deps:?}");
    assert!(reaches("writeback", "data"), "{deps:?}");
    assert!(
        !reaches("namespace", "data") && !reaches("namespace", "writeback"),
        "{deps:?}"
    );
    assert!(!reaches("data", "writeback"), "{deps:?}");
    for (m, d) in &deps {
        println!(
            "{m} -> {}",
            d.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
}
