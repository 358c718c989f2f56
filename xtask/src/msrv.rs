//! The workspace's `rust-version`, checked against the locked dependencies.
//!
//! A crate's minimum supported Rust version is the highest `rust-version` among the packages it
//! builds with. That covers the normal and build dependencies of every published crate, on
//! every target, as `Cargo.lock` pins them. Dev-dependencies build only the workspace's own
//! tests, which this toolchain runs. No older toolchain can be installed here to try a build.
//! This computation, with clippy's `incompatible_msrv` lint on the workspace's own code, is what
//! keeps the declared version true.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// A `rust-version` as three numbers, so that 1.88 = 1.88.0 < 1.93.1 < 1.100.
fn version_key(v: &str) -> [u64; 3] {
    let mut key = [0; 3];
    for (k, part) in key.iter_mut().zip(v.split('.')) {
        *k = part.parse().unwrap_or(0);
    }
    key
}

/// The highest `rust-version` that the published crates' locked normal and build dependencies
/// declare, with the packages that declare it.
pub fn required(metadata: &Value) -> Result<(String, Vec<String>)> {
    let packages: HashMap<&str, &Value> = (metadata["packages"].as_array())
        .context("cargo metadata has no packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let members: HashSet<&str> = (metadata["workspace_members"].as_array())
        .context("cargo metadata has no workspace members")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let nodes: HashMap<&str, &Value> = (metadata["resolve"]["nodes"].as_array())
        .context("cargo metadata has no resolve graph (run it without --no-deps)")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    // `publish = false` shows as an empty registry list.
    let published = |id: &&str| packages[*id]["publish"].is_null();
    let mut stack: Vec<&str> = members.iter().copied().filter(published).collect();
    let mut seen: HashSet<&str> = HashSet::new();
    while let Some(id) = stack.pop() {
        let Some(node) = nodes.get(id) else { continue };
        for dep in node["deps"].as_array().into_iter().flatten() {
            let used = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| matches!(k["kind"].as_str(), None | Some("build")));
            let Some(pkg) = dep["pkg"].as_str() else {
                continue;
            };
            // Workspace crates are walked through too: their own dependencies count.
            if used && seen.insert(pkg) {
                stack.push(pkg);
            }
        }
    }
    let mut best: Option<([u64; 3], String, Vec<String>)> = None;
    for id in seen.iter().filter(|id| !members.contains(*id)) {
        let p = packages[*id];
        let Some(rv) = p["rust_version"].as_str() else {
            continue;
        };
        let key = version_key(rv);
        let (name, version) = (p["name"].as_str(), p["version"].as_str());
        let who = format!("{} {}", name.unwrap_or("?"), version.unwrap_or("?"));
        match &mut best {
            Some((k, _, names)) if *k == key => names.push(who),
            Some((k, _, _)) if *k > key => {}
            _ => best = Some((key, rv.to_string(), vec![who])),
        }
    }
    let Some((_, version, mut names)) = best else {
        bail!("no dependency declares a rust-version");
    };
    names.sort();
    Ok((version, names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn versions_compare_as_numbers() {
        assert!(version_key("1.88") < version_key("1.93.1"));
        assert!(version_key("1.93.1") < version_key("1.100"));
        assert_eq!(version_key("1.88"), version_key("1.88.0"));
    }

    #[test]
    fn the_declared_rust_version_is_what_the_locked_dependencies_need() {
        let root = crate::workspace_root();
        let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(&root)
            .args(["metadata", "--format-version", "1", "--locked", "--offline"])
            .output()
            .expect("cargo metadata runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let metadata: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let (needed, by) = required(&metadata).expect("a version");
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let declared = manifest
            .lines()
            .find_map(|l| l.strip_prefix("rust-version = "))
            .expect("the workspace declares rust-version")
            .trim_matches('"');
        assert_eq!(
            version_key(declared),
            version_key(&needed),
            "Cargo.toml says rust-version = {declared:?}; the locked dependencies need {needed} \
             ({}); set it to that",
            by.join(", ")
        );
    }
}
