//! `cargo xtask cycles`: every crate's file-level import cycles, checked against an allowlist.
//!
//! A file depends on another when it names something defined there: in a `use` of `crate::`,
//! `super::`, `self::` or a child module, or in such a path written out in code
//! (`crate::backend::gpu::KvType::parse`, `super::prefetch::bar(..)`). A path leads to the
//! longest prefix of it that is a module, and so to that module's file; a name the module only
//! re-exports (`pub use error::Result` in `lib.rs`) is followed on to the file that defines it,
//! so that a crate root re-exporting its modules' types is not counted into every ring. A
//! `mod child;` declaration alone is no dependency, and test code (`mod tests`, anything under
//! `#[cfg(test)]`) is left out: what a test imports does not tie the crate's layers together.
//!
//! Files that depend on each other in a ring (a strongly connected component of two or more
//! files) can only be understood, moved or split together. Each ring must be in
//! [`ALLOWED_CYCLES`] with the reason it is tolerated. A ring missing there fails the check, and
//! so does an entry that matches no ring any more, so the list always says what the tree is.
//!
//! The sources are read as tokens (comments and string literals dropped), not compiled: macros
//! are not expanded, `#[path]` is followed, and `cfg`s other than test-only ones count as on.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::fs;
use std::path::{Component, Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {}

/// A ring of files tolerated for now, and why.
struct AllowedCycle {
    /// The package name from the crate's `Cargo.toml`.
    krate: &'static str,
    /// Every file of the ring, relative to the crate's directory.
    files: &'static [&'static str],
    reason: &'static str,
}

/// The rings the check lets pass, none now: every ring the first run found is broken. An entry
/// names a ring's files and why it is tolerated; remove it when the ring is broken, since the
/// check fails on entries that match nothing.
const ALLOWED_CYCLES: &[AllowedCycle] = &[];

pub fn run(_args: Args) -> Result<()> {
    check(&crate::workspace_root())
}

/// Prints every crate's import cycles, then fails on a cycle the allowlist does not name and on
/// an allowlist entry that names no cycle.
pub fn check(root: &Path) -> Result<()> {
    let crates = find_cycles(root)?;
    let verdict = judge(&crates, ALLOWED_CYCLES);
    print!("{}", report(&crates, &verdict));
    let failure = verdict.failure();
    if !failure.is_empty() {
        bail!("{failure}");
    }
    Ok(())
}

/// One crate's import cycles.
struct CrateCycles {
    name: String,
    /// The crate's directory, relative to the workspace root.
    dir: String,
    cycles: Vec<Cycle>,
}

/// A strongly connected component of two or more files.
struct Cycle {
    /// Sorted, relative to the crate's directory.
    files: Vec<String>,
    /// A closed walk through every file of the component, one dependency per step.
    steps: Vec<Step>,
}

/// One dependency: `from` names something of `to`, first at `from:line` through `via`.
struct Step {
    from: String,
    to: String,
    line: usize,
    via: String,
}

/// Every crate under `crates/`, and `xtask`, with the cycles of each of its targets.
fn find_cycles(root: &Path) -> Result<Vec<CrateCycles>> {
    let mut crate_dirs = Vec::new();
    let crates_dir = root.join("crates");
    if crates_dir.is_dir() {
        for entry in fs::read_dir(&crates_dir)
            .with_context(|| format!("listing {}", crates_dir.display()))?
        {
            let dir = entry?.path();
            if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
                crate_dirs.push(dir);
            }
        }
    }
    crate_dirs.sort();
    if root.join("xtask/src").is_dir() {
        crate_dirs.push(root.join("xtask"));
    }

    let mut crates = Vec::new();
    for dir in crate_dirs {
        let mut cycles: Vec<Cycle> = Vec::new();
        for target_root in target_roots(&dir)? {
            let target = Target::load(&dir, &target_root)?;
            for cycle in target.cycles() {
                if !cycles.iter().any(|known| known.files == cycle.files) {
                    cycles.push(cycle);
                }
            }
        }
        cycles.sort_by(|a, b| a.files.cmp(&b.files));
        crates.push(CrateCycles {
            name: package_name(&dir)?,
            dir: relative_key(root, &dir),
            cycles,
        });
    }
    Ok(crates)
}

/// The crate's targets' root files: the library, the main binary, the binaries under `src/bin`.
fn target_roots(crate_dir: &Path) -> Result<Vec<PathBuf>> {
    let src = crate_dir.join("src");
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|name| src.join(name))
        .filter(|path| path.is_file())
        .collect();
    let bin = src.join("bin");
    if bin.is_dir() {
        let mut bins = Vec::new();
        for entry in fs::read_dir(&bin).with_context(|| format!("listing {}", bin.display()))? {
            let path = entry?.path();
            if path.extension().is_some_and(|ext| ext == "rs") {
                bins.push(path);
            } else if path.join("main.rs").is_file() {
                bins.push(path.join("main.rs"));
            }
        }
        bins.sort();
        roots.extend(bins);
    }
    Ok(roots)
}

/// The `name` of the `[package]` table, read line by line (the manifests are plain).
fn package_name(crate_dir: &Path) -> Result<String> {
    let manifest = crate_dir.join("Cargo.toml");
    let text =
        fs::read_to_string(&manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            if let Some(value) = line.strip_prefix("name").map(str::trim_start) {
                if let Some(value) = value.strip_prefix('=') {
                    return Ok(value.trim().trim_matches('"').to_string());
                }
            }
        }
    }
    bail!("{} has no [package] name", manifest.display())
}

/// `path` relative to `base`, `/`-separated, with `.` and `..` worked out on the text.
fn relative_key(base: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(base).unwrap_or(path);
    let mut parts: Vec<String> = Vec::new();
    for component in relative.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir if parts.last().is_some_and(|last| last != "..") => {
                parts.pop();
            }
            other => parts.push(other.as_os_str().to_string_lossy().into_owned()),
        }
    }
    parts.join("/")
}

// ---------------------------------------------------------------------------------------------
// Tokens

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// A string literal's text; only `#[path = ".."]` reads it.
    Str(String),
    /// Any other literal (number, character).
    Literal,
    /// `::`
    PathSep,
    Punct(char),
}

#[derive(Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Splits Rust source into tokens, dropping whitespace and comments. Lifetimes and labels give
/// no token: nothing here needs them, and `'a` must not be read as a character.
fn lex(source: &str) -> Vec<Token> {
    let s: Vec<char> = source.chars().collect();
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let start_line = line;
        let mut push = |tok: Tok| {
            tokens.push(Token {
                tok,
                line: start_line,
            })
        };
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            // Block comments nest.
            let mut depth = 0usize;
            while i < s.len() {
                if s[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(s[i] == '\n');
                    i += 1;
                }
            }
        } else if let Some((text, end)) = string_literal(&s, i) {
            line += s[i..end].iter().filter(|&&c| c == '\n').count();
            push(Tok::Str(text));
            i = end;
        } else if c == '\'' || (c == 'b' && at(i + 1) == '\'') {
            let quote = if c == 'b' { i + 1 } else { i };
            let (is_char, end) = char_or_lifetime(&s, quote);
            if is_char {
                push(Tok::Literal);
            }
            i = end;
        } else if c == 'r' && at(i + 1) == '#' && is_ident_start(at(i + 2)) {
            let start = i + 2;
            i = start;
            while is_ident_char(at(i)) {
                i += 1;
            }
            push(Tok::Ident(s[start..i].iter().collect()));
        } else if is_ident_start(c) {
            let start = i;
            while is_ident_char(at(i)) {
                i += 1;
            }
            push(Tok::Ident(s[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            loop {
                while is_ident_char(at(i)) {
                    i += 1;
                }
                // `1.5` goes on; `1..2` and `x.0.1` stop at the dot's own token.
                if at(i) == '.' && at(i + 1).is_ascii_digit() {
                    i += 1;
                } else {
                    break;
                }
            }
            push(Tok::Literal);
        } else if c == ':' && at(i + 1) == ':' {
            push(Tok::PathSep);
            i += 2;
        } else {
            push(Tok::Punct(c));
            i += 1;
        }
    }
    tokens
}

/// A string literal starting at `i` (`".."`, `r#".."#`, `b".."`, `br".."`, `c".."`): its text
/// and the index after it.
fn string_literal(s: &[char], i: usize) -> Option<(String, usize)> {
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let mut j = i;
    if matches!(at(j), 'b' | 'c') {
        j += 1;
    }
    let raw = at(j) == 'r';
    if raw {
        j += 1;
    }
    let mut hashes = 0;
    while raw && at(j) == '#' {
        hashes += 1;
        j += 1;
    }
    if at(j) != '"' {
        return None;
    }
    j += 1;
    let mut text = String::new();
    while j < s.len() {
        let c = s[j];
        if !raw && c == '\\' {
            text.push(c);
            if let Some(&escaped) = s.get(j + 1) {
                text.push(escaped);
            }
            j += 2;
        } else if c == '"' && (0..hashes).all(|k| at(j + 1 + k) == '#') {
            return Some((text, j + 1 + hashes));
        } else {
            text.push(c);
            j += 1;
        }
    }
    Some((text, s.len()))
}

/// At a `'`: whether it opens a character literal (else a lifetime or label), and the index
/// after it.
fn char_or_lifetime(s: &[char], quote: usize) -> (bool, usize) {
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    if at(quote + 1) == '\\' {
        let mut j = quote + 3;
        while j < s.len() && s[j] != '\'' {
            j += 1;
        }
        return (true, j + 1);
    }
    if at(quote + 2) == '\'' {
        return (true, quote + 3);
    }
    let mut j = quote + 1;
    while is_ident_char(at(j)) {
        j += 1;
    }
    (false, j)
}

// ---------------------------------------------------------------------------------------------
// One file's scan

/// What one file says, per module scope: the file's own module (scope 0) and each inline
/// `mod name { .. }` in it.
#[derive(Default)]
struct FileScan {
    scopes: Vec<Scope>,
    /// `#![cfg(test)]` at the top: the whole file is test code.
    test_only: bool,
}

#[derive(Default)]
struct Scope {
    name: String,
    parent: Option<usize>,
    /// Items defined here (functions, types, traits, constants, statics, macros).
    items: BTreeSet<String>,
    uses: Vec<UseDecl>,
    paths: Vec<CodePath>,
    /// `mod name;` declarations: the name and its `#[path]`, if any.
    child_files: Vec<(String, Option<String>)>,
}

/// One leaf of a `use` tree.
struct UseDecl {
    /// The name it binds (`None` for a glob or `as _`).
    binding: Option<String>,
    path: Vec<String>,
    glob: bool,
    /// Declared among the module's items, where other modules can reach it (re-exports, a
    /// child's `super::Name`); a `use` inside a function serves that function only.
    module_level: bool,
    line: usize,
}

/// A path of two or more segments written in code, such as `super::prefetch::bar`.
struct CodePath {
    segments: Vec<String>,
    line: usize,
}

fn scan_file(tokens: &[Token]) -> FileScan {
    let mut parser = Parser {
        tokens,
        pos: 0,
        scan: FileScan {
            scopes: vec![Scope::default()],
            test_only: false,
        },
        open: Vec::new(),
    };
    parser.run();
    parser.scan
}

const ITEM_KEYWORDS: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "union",
    "trait",
    "type",
    "const",
    "static",
    "macro_rules",
];

/// Words that start an item (as opposed to a field, a match arm or an expression) after its
/// attributes.
const ITEM_STARTS: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "union",
    "trait",
    "type",
    "const",
    "static",
    "macro_rules",
    "mod",
    "use",
    "impl",
    "extern",
    "unsafe",
    "async",
    "let",
];

struct Parser<'t> {
    tokens: &'t [Token],
    pos: usize,
    scan: FileScan,
    /// The open braces, innermost last: `Some(scope)` for a module's own braces, `None` for any
    /// other block. Empty at the file's top level.
    open: Vec<Option<usize>>,
}

impl<'t> Parser<'t> {
    fn peek(&self, ahead: usize) -> Option<&'t Tok> {
        self.tokens.get(self.pos + ahead).map(|token| &token.tok)
    }

    fn is_punct(&self, ahead: usize, c: char) -> bool {
        self.peek(ahead) == Some(&Tok::Punct(c))
    }

    fn ident(&self, ahead: usize) -> Option<&'t str> {
        match self.peek(ahead) {
            Some(Tok::Ident(word)) => Some(word),
            _ => None,
        }
    }

    /// The module scope the parser is in.
    fn scope(&self) -> usize {
        self.open.iter().rev().find_map(|open| *open).unwrap_or(0)
    }

    /// Among a module's items, not inside a function, `impl` or type body.
    fn at_module_level(&self) -> bool {
        self.open.last().is_none_or(|open| open.is_some())
    }

    fn run(&mut self) {
        while let Some(tok) = self.peek(0) {
            if self.scan.test_only {
                return;
            }
            match tok {
                Tok::Punct('#') => self.attributes(),
                Tok::Punct('{') => {
                    self.open.push(None);
                    self.pos += 1;
                }
                Tok::Punct('}') => {
                    self.open.pop();
                    self.pos += 1;
                }
                Tok::Ident(word) => match word.as_str() {
                    "mod" => self.module(None),
                    "use" => self.use_declaration(),
                    // `pub(in crate::x)` names where an item is visible, not a dependency.
                    "pub" if self.is_punct(1, '(') => {
                        self.pos += 1;
                        self.skip_group();
                    }
                    word if self.at_module_level() && ITEM_KEYWORDS.contains(&word) => {
                        self.item_name();
                    }
                    _ => self.code_path(),
                },
                _ => self.pos += 1,
            }
        }
    }

    /// At an opening bracket: moves past its matching closer and returns the closer's index.
    fn skip_group(&mut self) -> usize {
        let mut depth = 0usize;
        while let Some(tok) = self.peek(0) {
            match tok {
                Tok::Punct('(' | '[' | '{') => depth += 1,
                Tok::Punct(')' | ']' | '}') => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        self.pos += 1;
                        return self.pos - 1;
                    }
                }
                _ => {}
            }
            self.pos += 1;
        }
        self.tokens.len()
    }

    fn skip_visibility(&mut self) {
        if self.ident(0) == Some("pub") {
            self.pos += 1;
            if self.is_punct(0, '(') {
                self.skip_group();
            }
        }
    }

    /// One or more attributes at `#`. A test-only `cfg` skips what it gates; `#[path]` goes to
    /// the `mod` it is on.
    fn attributes(&mut self) {
        let tokens = self.tokens;
        let mut test_only = false;
        let mut path = None;
        // Attributes hold code too: `#[error("..", n = crate::quant::supported_names())]`.
        let mut paths = Vec::new();
        while self.is_punct(0, '#') {
            let inner = self.is_punct(1, '!');
            let bracket = if inner { 2 } else { 1 };
            if !self.is_punct(bracket, '[') {
                self.pos += 1;
                return;
            }
            self.pos += bracket;
            let body_start = self.pos + 1;
            let close = self.skip_group();
            let body = &tokens[body_start.min(close)..close];
            if inner && gated_by_test("cfg", body) {
                self.skip_rest_of_block();
                return;
            }
            if !inner {
                test_only |= gated_by_test("cfg", body);
                path = path_attribute(body).or(path);
            }
            if !gated_by_test("cfg_attr", body) {
                let mut at = body_start;
                while at < close {
                    let (found, next) = path_at(tokens, at);
                    paths.extend(found);
                    at = next;
                }
            }
        }
        if test_only {
            self.skip_item();
            return;
        }
        let scope = self.scope();
        self.scan.scopes[scope].paths.append(&mut paths);
        if path.is_some() {
            self.skip_visibility();
            if self.ident(0) == Some("mod") {
                self.module(path);
            }
        }
    }

    /// After an inner `#![cfg(test)]`: the rest of the enclosing module (or file) is test code.
    fn skip_rest_of_block(&mut self) {
        if self.open.is_empty() {
            self.scan.test_only = true;
            return;
        }
        let mut depth = 0usize;
        while let Some(tok) = self.peek(0) {
            match tok {
                Tok::Punct('(' | '[' | '{') => depth += 1,
                Tok::Punct(')' | ']' | '}') => {
                    if depth == 0 {
                        // The enclosing block's own closer: the main loop pops it.
                        return;
                    }
                    depth -= 1;
                }
                _ => {}
            }
            self.pos += 1;
        }
    }

    /// Skips what a test-only attribute gates: an item up to its `;` or its body's `}`, or a
    /// field, match arm or statement up to its `,` or `;`.
    fn skip_item(&mut self) {
        self.skip_visibility();
        let item = self
            .ident(0)
            .is_some_and(|word| ITEM_STARTS.contains(&word));
        let mut depth = 0usize;
        while let Some(tok) = self.peek(0) {
            match tok {
                Tok::Punct('(' | '[' | '{') => depth += 1,
                Tok::Punct(closer @ (')' | ']' | '}')) => {
                    if depth == 0 {
                        // The enclosing block ends: the gated thing was its last.
                        return;
                    }
                    depth -= 1;
                    if depth == 0 && *closer == '}' && item {
                        self.pos += 1;
                        return;
                    }
                }
                Tok::Punct(';') if depth == 0 => {
                    self.pos += 1;
                    return;
                }
                Tok::Punct(',') if depth == 0 && !item => {
                    self.pos += 1;
                    return;
                }
                _ => {}
            }
            self.pos += 1;
        }
    }

    /// At `mod`: a child module's file to load, or an inline module to enter. A module named
    /// `tests` is test code whether or not it says `#[cfg(test)]`.
    fn module(&mut self, path_attribute: Option<String>) {
        let Some(name) = self.ident(1) else {
            self.pos += 1;
            return;
        };
        self.pos += 2;
        let parent = self.scope();
        if self.is_punct(0, ';') {
            self.pos += 1;
            if name != "tests" {
                let declared = (name.to_string(), path_attribute);
                self.scan.scopes[parent].child_files.push(declared);
            }
        } else if self.is_punct(0, '{') {
            if name == "tests" {
                self.skip_group();
                return;
            }
            self.scan.scopes.push(Scope {
                name: name.to_string(),
                parent: Some(parent),
                ..Scope::default()
            });
            self.open.push(Some(self.scan.scopes.len() - 1));
            self.pos += 1;
        }
    }

    /// At `use`: records every leaf of the tree.
    fn use_declaration(&mut self) {
        let line = self.tokens[self.pos].line;
        self.pos += 1;
        if self.is_punct(0, '<') {
            // `impl Trait + use<'a>` (precise capturing) is no import.
            return;
        }
        // `use ::name::..` starts at an external crate.
        let external = self.peek(0) == Some(&Tok::PathSep);
        if external {
            self.pos += 1;
        }
        let mut leaves = Vec::new();
        self.use_tree(Vec::new(), &mut leaves);
        if !external {
            let scope = self.scope();
            let module_level = self.at_module_level();
            for (binding, path, glob) in leaves {
                self.scan.scopes[scope].uses.push(UseDecl {
                    binding,
                    path,
                    glob,
                    module_level,
                    line,
                });
            }
        }
        while let Some(tok) = self.peek(0) {
            self.pos += 1;
            if *tok == Tok::Punct(';') {
                break;
            }
        }
    }

    /// One `use` tree under `prefix`; pushes `(binding, path, glob)` for each leaf.
    fn use_tree(
        &mut self,
        prefix: Vec<String>,
        leaves: &mut Vec<(Option<String>, Vec<String>, bool)>,
    ) {
        let mut path = prefix;
        loop {
            match self.peek(0) {
                Some(Tok::Ident(segment)) => {
                    path.push(segment.clone());
                    self.pos += 1;
                }
                // `$crate` in a macro is the crate that defines the macro.
                Some(Tok::Punct('$')) if self.ident(1) == Some("crate") => {
                    path.push("crate".to_string());
                    self.pos += 2;
                }
                Some(Tok::Punct('{')) => {
                    self.pos += 1;
                    while let Some(tok) = self.peek(0) {
                        match tok {
                            Tok::Punct('}') => {
                                self.pos += 1;
                                break;
                            }
                            Tok::Punct(',') => self.pos += 1,
                            _ => {
                                let before = self.pos;
                                self.use_tree(path.clone(), leaves);
                                if self.pos == before {
                                    self.pos += 1;
                                }
                            }
                        }
                    }
                    return;
                }
                Some(Tok::Punct('*')) => {
                    self.pos += 1;
                    leaves.push((None, path, true));
                    return;
                }
                _ => break,
            }
            if self.peek(0) == Some(&Tok::PathSep) {
                self.pos += 1;
            } else {
                break;
            }
        }
        // `a::b::{self}` binds `b`.
        if path.last().is_some_and(|last| last == "self") {
            path.pop();
        }
        let mut binding = path.last().cloned();
        if self.ident(0) == Some("as") {
            binding = self
                .ident(1)
                .filter(|alias| *alias != "_")
                .map(str::to_string);
            self.pos += 2;
        }
        if !path.is_empty() {
            leaves.push((binding, path, false));
        }
    }

    /// At an item keyword among a module's items: records the item's name.
    fn item_name(&mut self) {
        let keyword = self.ident(0);
        let mut name_at = 1;
        if keyword == Some("macro_rules") {
            name_at = 2;
        }
        if keyword == Some("static") && self.ident(1) == Some("mut") {
            name_at = 2;
        }
        if let Some(name) = self.ident(name_at) {
            // `const fn f`, `const unsafe fn f`: the later keyword names it.
            if !matches!(name, "fn" | "unsafe" | "extern" | "async" | "_") {
                let scope = self.scope();
                self.scan.scopes[scope].items.insert(name.to_string());
            }
        }
        self.pos += 1;
    }

    /// At an identifier: records the path it starts, if it has two or more segments.
    fn code_path(&mut self) {
        let (path, next) = path_at(self.tokens, self.pos);
        self.pos = next;
        if let Some(path) = path {
            let scope = self.scope();
            self.scan.scopes[scope].paths.push(path);
        }
    }
}

/// The path of two or more segments that starts at `tokens[first]`, if one does, and the index
/// after what was read.
fn path_at(tokens: &[Token], first: usize) -> (Option<CodePath>, usize) {
    let tok = |i: usize| tokens.get(i).map(|token| &token.tok);
    let before = first.checked_sub(1).and_then(tok);
    let field = matches!(before, Some(Tok::Punct('.')))
        && !matches!(first.checked_sub(2).and_then(tok), Some(Tok::Punct('.')));
    // `::std::x` (external), a field or method `a.b`, and the tail of `Vec::<u8>::new` start no
    // path; after a range's `..` one does start.
    let continues_other = field || matches!(before, Some(Tok::PathSep));
    let mut segments = Vec::new();
    let mut pos = first;
    while let Some(Tok::Ident(segment)) = tok(pos) {
        segments.push(segment.clone());
        pos += 1;
        if tok(pos) == Some(&Tok::PathSep) {
            pos += 1;
        } else {
            break;
        }
    }
    let next = pos.max(first + 1);
    // A macro's `$var::x` is whatever the caller passes; only `$crate::x` is known.
    let macro_variable = matches!(before, Some(Tok::Punct('$')))
        && segments.first().is_some_and(|first| first != "crate");
    if segments.len() < 2 || continues_other || macro_variable {
        return (None, next);
    }
    let line = tokens[first].line;
    (Some(CodePath { segments, line }), next)
}

/// Whether an attribute is `cfg(P)` (or `cfg_attr(P, ..)`, as `attribute` says) with P true
/// only under test: `test`, an `all(..)` with a test-only term, or an `any(..)` of test-only
/// terms.
fn gated_by_test(attribute: &str, body: &[Token]) -> bool {
    match body {
        [Token {
            tok: Tok::Ident(word),
            ..
        }, Token {
            tok: Tok::Punct('('),
            ..
        }, predicate @ ..]
            if word == attribute =>
        {
            test_only_predicate(predicate, &mut 0)
        }
        _ => false,
    }
}

fn test_only_predicate(tokens: &[Token], pos: &mut usize) -> bool {
    let tok = |i: usize| tokens.get(i).map(|token| &token.tok);
    let Some(Tok::Ident(name)) = tok(*pos) else {
        return false;
    };
    *pos += 1;
    match tok(*pos) {
        Some(Tok::Punct('(')) => {
            *pos += 1;
            let mut terms = Vec::new();
            loop {
                match tok(*pos) {
                    None => break,
                    Some(Tok::Punct(')')) => {
                        *pos += 1;
                        break;
                    }
                    Some(Tok::Punct(',')) => *pos += 1,
                    Some(_) => {
                        let before = *pos;
                        terms.push(test_only_predicate(tokens, pos));
                        *pos = (*pos).max(before + 1);
                    }
                }
            }
            match name.as_str() {
                "all" => terms.contains(&true),
                "any" => !terms.is_empty() && !terms.contains(&false),
                _ => false,
            }
        }
        // `feature = ".."` and the like.
        Some(Tok::Punct('=')) => {
            *pos += 2;
            false
        }
        _ => name == "test",
    }
}

/// The file of `#[path = "file"]`.
fn path_attribute(body: &[Token]) -> Option<String> {
    match body {
        [Token {
            tok: Tok::Ident(word),
            ..
        }, Token {
            tok: Tok::Punct('='),
            ..
        }, Token {
            tok: Tok::Str(file),
            ..
        }] if word == "path" => Some(file.clone()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// One target's module tree and its file graph

/// One crate target (the library or one binary): its module tree over its files.
struct Target {
    /// Relative to the crate's directory, `/`-separated.
    files: Vec<String>,
    /// Module 0 is the crate root.
    modules: Vec<Module>,
}

struct Module {
    parent: Option<usize>,
    file: usize,
    children: BTreeMap<String, usize>,
    items: BTreeSet<String>,
    uses: Vec<UseDecl>,
    paths: Vec<CodePath>,
}

#[derive(Clone, Copy)]
enum Resolved {
    Module(usize),
    /// Something that is not a module, defined in this file.
    Item(usize),
}

/// How a name looks from a module.
enum Lookup {
    Found(Resolved),
    /// Imported from outside the crate (std, a dependency).
    External,
    Missing,
}

/// How deep one resolution may follow imports and re-exports, so that a ring of re-exports (or
/// a misread one) ends.
const MAX_HOPS: usize = 32;

impl Target {
    fn load(crate_dir: &Path, root_file: &Path) -> Result<Target> {
        let mut target = Target {
            files: Vec::new(),
            modules: Vec::new(),
        };
        let root = target.add_module(None, "");
        target.load_file(crate_dir, root_file, root, true)?;
        Ok(target)
    }

    fn add_module(&mut self, parent: Option<usize>, name: &str) -> usize {
        let id = self.modules.len();
        self.modules.push(Module {
            parent,
            file: usize::MAX,
            children: BTreeMap::new(),
            items: BTreeSet::new(),
            uses: Vec::new(),
            paths: Vec::new(),
        });
        if let Some(parent) = parent {
            self.modules[parent].children.insert(name.to_string(), id);
        }
        id
    }

    /// Reads `path` as the file of `module`, then the files of the modules it declares.
    /// `mod_rs`: the file's children live next to it (`lib.rs`, `main.rs`, `mod.rs`, a `#[path]`
    /// file) rather than in a folder named after it (`foo.rs` → `foo/`).
    fn load_file(
        &mut self,
        crate_dir: &Path,
        path: &Path,
        module: usize,
        mod_rs: bool,
    ) -> Result<()> {
        let file = self.files.len();
        self.files.push(relative_key(crate_dir, path));
        self.modules[module].file = file;
        let source =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let scan = scan_file(&lex(&source));
        if scan.test_only {
            return Ok(());
        }

        let file_dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
        let own_dir = if mod_rs {
            file_dir.clone()
        } else {
            file_dir.join(path.file_stem().unwrap_or_default())
        };
        let mut ids = Vec::with_capacity(scan.scopes.len());
        // The folder that a scope's `mod x;` files sit in: its inline modules nest as folders.
        let mut scope_dirs: Vec<PathBuf> = Vec::with_capacity(scan.scopes.len());
        let mut declared = Vec::new();
        for (local, scope) in scan.scopes.into_iter().enumerate() {
            let (id, dir) = match scope.parent {
                None => (module, own_dir.clone()),
                Some(parent) => (
                    self.add_module(Some(ids[parent]), &scope.name),
                    scope_dirs[parent].join(&scope.name),
                ),
            };
            let entry = &mut self.modules[id];
            entry.file = file;
            entry.items = scope.items;
            entry.uses = scope.uses;
            entry.paths = scope.paths;
            for (name, path_attribute) in scope.child_files {
                let (child_path, child_mod_rs) = match path_attribute {
                    // Outside inline modules a `#[path]` is relative to the declaring file.
                    Some(relative) if local == 0 => (file_dir.join(relative), true),
                    Some(relative) => (dir.join(relative), true),
                    None => {
                        let flat = dir.join(format!("{name}.rs"));
                        if flat.is_file() {
                            (flat, false)
                        } else {
                            (dir.join(&name).join("mod.rs"), true)
                        }
                    }
                };
                declared.push((id, name, child_path, child_mod_rs));
            }
            ids.push(id);
            scope_dirs.push(dir);
        }
        for (parent, name, child_path, child_mod_rs) in declared {
            if !child_path.is_file() {
                // A `mod` behind a `cfg` for another platform, say; the compiler checks the rest.
                eprintln!(
                    "note: {}: `mod {name};` has no file at {}; left out",
                    self.files[file],
                    child_path.display()
                );
                continue;
            }
            let child = self.add_module(Some(parent), &name);
            self.load_file(crate_dir, &child_path, child, child_mod_rs)?;
        }
        Ok(())
    }

    fn file_of(&self, resolved: Resolved) -> usize {
        match resolved {
            Resolved::Module(module) => self.modules[module].file,
            Resolved::Item(file) => file,
        }
    }

    /// What `path`, written in module `scope`, names; `None` when it leaves the crate or starts
    /// at something local the scan does not know (a variable, a generic parameter, `Self`).
    fn resolve(&self, scope: usize, path: &[String], hops: usize) -> Option<Resolved> {
        if hops > MAX_HOPS {
            return None;
        }
        let (first, rest) = path.split_first()?;
        let mut at = match first.as_str() {
            "crate" => Resolved::Module(0),
            "self" => Resolved::Module(scope),
            "super" => Resolved::Module(self.modules[scope].parent?),
            name => match self.lookup(scope, name, true, hops) {
                Lookup::Found(resolved) => resolved,
                Lookup::External | Lookup::Missing => return None,
            },
        };
        for segment in rest {
            let Resolved::Module(module) = at else {
                // Past the defining file: a variant, an associated item.
                break;
            };
            at = match segment.as_str() {
                "self" => at,
                "super" => Resolved::Module(self.modules[module].parent?),
                name => match self.lookup(module, name, false, hops) {
                    Lookup::Found(resolved) => resolved,
                    Lookup::External => return None,
                    // An item the scan did not see (made by a macro, say): still that module's.
                    Lookup::Missing => Resolved::Item(self.modules[module].file),
                },
            };
        }
        Some(at)
    }

    /// `name` as seen in `module`: a child module, an import (followed to what it names), an
    /// item, or something a glob import brings. `inside`: looked up from code in the module
    /// itself, which also sees the `use`s inside its functions.
    fn lookup(&self, module: usize, name: &str, inside: bool, hops: usize) -> Lookup {
        let here = &self.modules[module];
        if let Some(&child) = here.children.get(name) {
            return Lookup::Found(Resolved::Module(child));
        }
        let visible = |decl: &&UseDecl| inside || decl.module_level;
        let mut imported = false;
        for decl in here.uses.iter().filter(visible) {
            if decl.binding.as_deref() == Some(name) {
                imported = true;
                if let Some(resolved) = self.resolve(module, &decl.path, hops + 1) {
                    return Lookup::Found(resolved);
                }
            }
        }
        if imported {
            return Lookup::External;
        }
        if here.items.contains(name) {
            return Lookup::Found(Resolved::Item(here.file));
        }
        for glob in here.uses.iter().filter(visible).filter(|decl| decl.glob) {
            if let Some(Resolved::Module(source)) = self.resolve(module, &glob.path, hops + 1) {
                match self.lookup(source, name, false, hops + 1) {
                    Lookup::Missing => {}
                    found => return found,
                }
            }
        }
        Lookup::Missing
    }

    /// Every dependency between two different files, with the first place that shows it.
    fn dependencies(&self) -> BTreeMap<(usize, usize), (usize, String)> {
        let mut dependencies: BTreeMap<(usize, usize), (usize, String)> = BTreeMap::new();
        let mut note = |from: usize, to: usize, line: usize, via: String| {
            if from == to {
                return;
            }
            let first = dependencies
                .entry((from, to))
                .or_insert((line, via.clone()));
            if line < first.0 {
                *first = (line, via);
            }
        };
        for (id, module) in self.modules.iter().enumerate() {
            for decl in &module.uses {
                if let Some(resolved) = self.resolve(id, &decl.path, 0) {
                    let glob = if decl.glob { "::*" } else { "" };
                    let via = format!("use {}{glob}", decl.path.join("::"));
                    note(module.file, self.file_of(resolved), decl.line, via);
                }
            }
            for path in &module.paths {
                if let Some(resolved) = self.resolve(id, &path.segments, 0) {
                    note(
                        module.file,
                        self.file_of(resolved),
                        path.line,
                        path.segments.join("::"),
                    );
                }
            }
        }
        dependencies
    }

    /// The target's strongly connected components of two or more files.
    fn cycles(&self) -> Vec<Cycle> {
        let dependencies = self.dependencies();
        let mut next = vec![BTreeSet::new(); self.files.len()];
        for &(from, to) in dependencies.keys() {
            next[from].insert(to);
        }
        let mut cycles = Vec::new();
        for component in strongly_connected(&next) {
            if component.len() < 2 {
                continue;
            }
            let members: BTreeSet<usize> = component.iter().copied().collect();
            let walk = closed_walk(&members, &next, &self.files);
            let steps = walk
                .windows(2)
                .map(|pair| {
                    let (line, via) = &dependencies[&(pair[0], pair[1])];
                    Step {
                        from: self.files[pair[0]].clone(),
                        to: self.files[pair[1]].clone(),
                        line: *line,
                        via: via.clone(),
                    }
                })
                .collect();
            let mut files: Vec<String> = component.iter().map(|&f| self.files[f].clone()).collect();
            files.sort();
            cycles.push(Cycle { files, steps });
        }
        cycles
    }
}

/// Tarjan's strongly connected components of the graph `next` (node → its successors).
fn strongly_connected(next: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct Search<'g> {
        next: &'g [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        components: Vec<Vec<usize>>,
    }
    impl Search<'_> {
        fn visit(&mut self, node: usize) {
            self.index[node] = Some(self.counter);
            self.low[node] = self.counter;
            self.counter += 1;
            self.stack.push(node);
            self.on_stack[node] = true;
            let next = self.next;
            for &successor in &next[node] {
                match self.index[successor] {
                    None => {
                        self.visit(successor);
                        self.low[node] = self.low[node].min(self.low[successor]);
                    }
                    Some(index) if self.on_stack[successor] => {
                        self.low[node] = self.low[node].min(index);
                    }
                    Some(_) => {}
                }
            }
            if Some(self.low[node]) == self.index[node] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack[member] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                self.components.push(component);
            }
        }
    }
    let nodes = next.len();
    let mut search = Search {
        next,
        index: vec![None; nodes],
        low: vec![0; nodes],
        on_stack: vec![false; nodes],
        stack: Vec::new(),
        counter: 0,
        components: Vec::new(),
    };
    for node in 0..nodes {
        if search.index[node].is_none() {
            search.visit(node);
        }
    }
    search.components
}

/// A walk inside the component from its first file (by name) through every file and back,
/// each leg a shortest path: a chain that reads `a -> b -> .. -> a`.
fn closed_walk(
    members: &BTreeSet<usize>,
    next: &[BTreeSet<usize>],
    names: &[String],
) -> Vec<usize> {
    let start = *members
        .iter()
        .min_by_key(|&&file| &names[file])
        .expect("a component has members");
    let mut unvisited: BTreeSet<usize> = members.clone();
    unvisited.remove(&start);
    let mut walk = vec![start];
    let mut at = start;
    while !unvisited.is_empty() {
        let Some(leg) = shortest_path(at, |file| unvisited.contains(&file), members, next, names)
        else {
            break;
        };
        for &file in &leg[1..] {
            unvisited.remove(&file);
        }
        walk.extend_from_slice(&leg[1..]);
        at = *walk.last().unwrap_or(&start);
    }
    if let Some(home) = shortest_path(at, |file| file == start, members, next, names) {
        walk.extend_from_slice(&home[1..]);
    }
    walk
}

/// The shortest path within `members` from `from` to a file meeting `goal` (`from` itself
/// only by coming back to it), trying successors in name order so the output is stable.
fn shortest_path(
    from: usize,
    goal: impl Fn(usize) -> bool,
    members: &BTreeSet<usize>,
    next: &[BTreeSet<usize>],
    names: &[String],
) -> Option<Vec<usize>> {
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(file) = queue.pop_front() {
        let mut successors: Vec<usize> = next[file].intersection(members).copied().collect();
        successors.sort_by_key(|&successor| &names[successor]);
        for successor in successors {
            if goal(successor) {
                let mut path = vec![successor];
                let mut back = file;
                loop {
                    path.push(back);
                    if back == from {
                        break;
                    }
                    back = came_from[&back];
                }
                path.reverse();
                return Some(path);
            }
            if successor != from && !came_from.contains_key(&successor) {
                came_from.insert(successor, file);
                queue.push_back(successor);
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// The verdict

struct Verdict<'a> {
    /// Per crate, per cycle: the allowlist entry that lets it pass.
    allowed: Vec<Vec<Option<&'a AllowedCycle>>>,
    /// Disallowed cycles: (crate, files).
    disallowed: Vec<(String, Vec<String>)>,
    /// Allowlist entries that match no cycle.
    stale: Vec<&'a AllowedCycle>,
}

fn judge<'a>(crates: &[CrateCycles], allowlist: &'a [AllowedCycle]) -> Verdict<'a> {
    let entry_files = |entry: &AllowedCycle| {
        let mut files: Vec<String> = entry.files.iter().map(|f| f.to_string()).collect();
        files.sort();
        files
    };
    let matches = |entry: &AllowedCycle, krate: &CrateCycles, cycle: &Cycle| {
        entry.krate == krate.name && entry_files(entry) == cycle.files
    };
    let mut verdict = Verdict {
        allowed: Vec::new(),
        disallowed: Vec::new(),
        stale: Vec::new(),
    };
    for krate in crates {
        let mut allowed = Vec::new();
        for cycle in &krate.cycles {
            let entry = allowlist.iter().find(|entry| matches(entry, krate, cycle));
            if entry.is_none() {
                verdict
                    .disallowed
                    .push((krate.name.clone(), cycle.files.clone()));
            }
            allowed.push(entry);
        }
        verdict.allowed.push(allowed);
    }
    verdict.stale = allowlist
        .iter()
        .filter(|entry| {
            !crates.iter().any(|krate| {
                krate
                    .cycles
                    .iter()
                    .any(|cycle| matches(entry, krate, cycle))
            })
        })
        .collect();
    verdict
}

impl Verdict<'_> {
    /// What is wrong and how to mend it; empty when the check passes.
    fn failure(&self) -> String {
        let mut text = String::new();
        if !self.disallowed.is_empty() {
            let _ = writeln!(
                text,
                "{} import cycle(s) not in the allowlist (ALLOWED_CYCLES in xtask/src/cycles.rs):",
                self.disallowed.len()
            );
            for (krate, files) in &self.disallowed {
                let _ = writeln!(text, "  {krate}: {}", files.join(", "));
            }
            let _ = writeln!(
                text,
                "break it by moving shared items down, or add it to the allowlist with a reason:"
            );
            for (krate, files) in &self.disallowed {
                let quoted: Vec<String> = files.iter().map(|f| format!("{f:?}")).collect();
                let _ = writeln!(
                    text,
                    "    AllowedCycle {{ krate: {krate:?}, files: &[{}], reason: \"..\" }},",
                    quoted.join(", ")
                );
            }
        }
        if !self.stale.is_empty() {
            let (entries, match_, them) = if self.stale.len() == 1 {
                ("entry", "matches", "it")
            } else {
                ("entries", "match", "them")
            };
            let _ = writeln!(
                text,
                "{} allowlist {entries} in xtask/src/cycles.rs {match_} no cycle any more; remove {them}:",
                self.stale.len(),
            );
            for entry in &self.stale {
                let _ = writeln!(
                    text,
                    "  {}: {} ({})",
                    entry.krate,
                    entry.files.join(", "),
                    entry.reason
                );
            }
        }
        text.trim_end().to_string()
    }
}

fn report(crates: &[CrateCycles], verdict: &Verdict) -> String {
    let mut text = String::new();
    for (krate, allowed) in crates.iter().zip(&verdict.allowed) {
        if krate.cycles.is_empty() {
            let _ = writeln!(text, "{} ({}): no import cycles", krate.name, krate.dir);
            continue;
        }
        let _ = writeln!(
            text,
            "{} ({}): {} import cycle(s)",
            krate.name,
            krate.dir,
            krate.cycles.len()
        );
        for (cycle, entry) in krate.cycles.iter().zip(allowed) {
            let mut chain = vec![cycle.steps.first().map_or("", |step| step.from.as_str())];
            chain.extend(cycle.steps.iter().map(|step| step.to.as_str()));
            let status = match entry {
                Some(entry) => format!("allowed: {}", entry.reason),
                None => "NOT ALLOWED".to_string(),
            };
            let _ = writeln!(text, "  {} files, {status}", cycle.files.len());
            let _ = writeln!(text, "    {}", chain.join(" -> "));
            for step in &cycle.steps {
                let _ = writeln!(
                    text,
                    "      {}:{} `{}` -> {}",
                    step.from, step.line, step.via, step.to
                );
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace holding one crate, `demo`, made of `files` (path in the crate, text), in a
    /// folder of its own under the temp dir; removed when dropped.
    struct Scratch {
        root: PathBuf,
    }

    impl Scratch {
        fn new(test: &str, files: &[(&str, &str)]) -> Scratch {
            let root =
                std::env::temp_dir().join(format!("xtask-cycles-{test}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            let crate_dir = root.join("crates/demo");
            let manifest = (
                "Cargo.toml",
                "[package]\nname = \"demo\"\nversion = \"0.1.0\"\n",
            );
            for (path, text) in std::iter::once(&manifest).chain(files) {
                let path = crate_dir.join(path);
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                fs::write(&path, text).unwrap();
            }
            Scratch { root }
        }

        fn crate_dir(&self) -> PathBuf {
            self.root.join("crates/demo")
        }

        /// The components found, as (crate, sorted files).
        fn components(&self) -> Vec<(String, Vec<String>)> {
            find_cycles(&self.root)
                .unwrap()
                .into_iter()
                .flat_map(|krate| {
                    let name = krate.name;
                    krate
                        .cycles
                        .into_iter()
                        .map(move |cycle| (name.clone(), cycle.files))
                })
                .collect()
        }

        /// The library's file dependencies, as (from, to).
        fn dependencies(&self) -> Vec<(String, String)> {
            let target =
                Target::load(&self.crate_dir(), &self.crate_dir().join("src/lib.rs")).unwrap();
            let names =
                |(from, to): (usize, usize)| (target.files[from].clone(), target.files[to].clone());
            target.dependencies().into_keys().map(names).collect()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    fn component(files: &[&str]) -> (String, Vec<String>) {
        (
            "demo".to_string(),
            files.iter().map(|f| f.to_string()).collect(),
        )
    }

    fn dependency(from: &str, to: &str) -> (String, String) {
        (from.to_string(), to.to_string())
    }

    #[test]
    fn a_child_using_super_and_its_parent_using_the_child_are_a_cycle() {
        let scratch = Scratch::new(
            "super",
            &[
                ("src/lib.rs", "pub mod ring;\n"),
                (
                    "src/ring.rs",
                    "mod inner;\n\npub struct Config;\n\npub fn run() -> Option<Config> {\n    inner::helper()\n}\n",
                ),
                (
                    "src/ring/inner.rs",
                    "use super::Config;\n\npub fn helper() -> Option<Config> {\n    None\n}\n",
                ),
            ],
        );
        assert_eq!(
            scratch.components(),
            [component(&["src/ring.rs", "src/ring/inner.rs"])]
        );
    }

    #[test]
    fn a_crate_path_in_code_makes_a_cycle_and_comments_and_strings_do_not() {
        // `left` mentions `lonely` only in comments and strings; `lonely` depends on `left`,
        // so reading those would pull `lonely` into the cycle.
        let left = r###"/// Calls [`crate::lonely::x`] in the docs only.
pub fn f() -> u32 {
    /* crate::lonely::x() in /* a nested */ comment */
    let _text = "crate::lonely::x() \" still in the string";
    let _raw = r#"crate::lonely::x() "quoted""#;
    crate::right::g() + 1
}

pub const NAME: &str = "left";
"###;
        let right = "pub fn g() -> u32 {\n    (1..crate::left::NAME.len()).count() as u32\n}\n";
        let scratch = Scratch::new(
            "crate-path",
            &[
                (
                    "src/lib.rs",
                    "pub mod left;\npub mod lonely;\npub mod right;\n",
                ),
                ("src/left.rs", left),
                ("src/right.rs", right),
                (
                    "src/lonely.rs",
                    "pub fn x() -> u32 {\n    crate::left::f()\n}\n",
                ),
            ],
        );
        assert_eq!(
            scratch.components(),
            [component(&["src/left.rs", "src/right.rs"])]
        );
    }

    #[test]
    fn a_mod_declaration_alone_is_no_dependency() {
        let scratch = Scratch::new(
            "mod-declaration",
            &[
                ("src/lib.rs", "pub mod tree;\n"),
                ("src/tree.rs", "pub mod leaf;\n\npub fn root_fn() {}\n"),
                (
                    "src/tree/leaf.rs",
                    "use super::root_fn;\n\npub fn call() {\n    root_fn()\n}\n",
                ),
            ],
        );
        assert_eq!(
            scratch.dependencies(),
            [dependency("src/tree/leaf.rs", "src/tree.rs")]
        );
        assert_eq!(scratch.components(), []);
    }

    #[test]
    fn test_only_imports_do_not_count() {
        let helper = r#"pub fn h() {}

#[cfg(test)]
use crate::solo::Other;

#[cfg(all(test, unix))]
fn only_in_tests() -> crate::solo::Other {
    crate::solo::Other
}

#[cfg_attr(test, derive(crate::solo::Other))]
pub struct Marker;

mod tests {
    use crate::solo::s;
}

#[cfg(test)]
pub(crate) mod test_support {
    pub fn call() {
        crate::solo::s()
    }
}
"#;
        let scratch = Scratch::new(
            "test-only",
            &[
                ("src/lib.rs", "pub mod helper;\npub mod solo;\n"),
                (
                    "src/solo.rs",
                    "use crate::helper::h;\n\npub struct Other;\n\npub fn s() {\n    h()\n}\n",
                ),
                ("src/helper.rs", helper),
            ],
        );
        assert_eq!(
            scratch.dependencies(),
            [dependency("src/solo.rs", "src/helper.rs")]
        );
        assert_eq!(scratch.components(), []);
    }

    #[test]
    fn a_re_export_leads_to_the_defining_file() {
        // `crate::Error` is defined in error.rs; lib.rs only re-exports it, so error.rs naming
        // `crate::Error` depends on itself, not on lib.rs (which would make lib.rs a ring).
        let scratch = Scratch::new(
            "re-export",
            &[
                ("src/lib.rs", "pub mod error;\npub mod reader;\n\npub use error::Error;\n"),
                (
                    "src/error.rs",
                    "#[derive(Debug)]\npub struct Error;\n\npub fn fail() -> crate::Error {\n    Error\n}\n",
                ),
                (
                    "src/reader.rs",
                    "use crate::Error;\n\npub fn read() -> Result<(), Error> {\n    Err(crate::error::fail())\n}\n",
                ),
            ],
        );
        assert_eq!(
            scratch.dependencies(),
            [
                dependency("src/lib.rs", "src/error.rs"),
                dependency("src/reader.rs", "src/error.rs")
            ]
        );
        assert_eq!(scratch.components(), []);
    }

    #[test]
    fn the_chain_walks_every_file_of_a_cycle_and_back() {
        let scratch = Scratch::new(
            "chain",
            &[
                ("src/lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
                ("src/a.rs", "pub fn fa() {\n    crate::b::fb()\n}\n"),
                ("src/b.rs", "pub fn fb() {\n    crate::c::fc()\n}\n"),
                ("src/c.rs", "pub fn fc() {\n    crate::a::fa()\n}\n"),
            ],
        );
        let crates = find_cycles(&scratch.root).unwrap();
        let text = report(&crates, &judge(&crates, &[]));
        assert!(
            text.contains("src/a.rs -> src/b.rs -> src/c.rs -> src/a.rs\n"),
            "no closed chain in:\n{text}"
        );
        assert!(
            text.contains("src/c.rs:2 `crate::a::fa` -> src/a.rs\n"),
            "no evidence in:\n{text}"
        );
    }

    #[test]
    fn the_allowlist_fails_on_unlisted_and_on_stale_entries() {
        let cycle = |files: &[&str]| Cycle {
            files: files.iter().map(|f| f.to_string()).collect(),
            steps: Vec::new(),
        };
        let crates = [CrateCycles {
            name: "demo".to_string(),
            dir: "crates/demo".to_string(),
            cycles: vec![
                cycle(&["src/a.rs", "src/b.rs"]),
                cycle(&["src/c.rs", "src/d.rs"]),
            ],
        }];
        let allow = |files: &'static [&'static str]| AllowedCycle {
            krate: "demo",
            files,
            reason: "a reason",
        };
        // Entries need not list their files sorted.
        let all_listed = [
            allow(&["src/b.rs", "src/a.rs"]),
            allow(&["src/c.rs", "src/d.rs"]),
        ];
        assert_eq!(judge(&crates, &all_listed).failure(), "");

        let one_listed_one_stale = [
            allow(&["src/b.rs", "src/a.rs"]),
            allow(&["src/a.rs", "src/c.rs"]),
        ];
        let failure = judge(&crates, &one_listed_one_stale).failure();
        assert!(failure.contains("demo: src/c.rs, src/d.rs\n"), "{failure}");
        assert!(
            failure.contains(
                "break it by moving shared items down, or add it to the allowlist with a reason"
            ),
            "{failure}"
        );
        assert!(
            failure.contains("demo: src/a.rs, src/c.rs (a reason)"),
            "{failure}"
        );
        assert!(!failure.contains("src/b.rs"), "{failure}");

        let other_crate = [AllowedCycle {
            krate: "other",
            files: &["src/a.rs", "src/b.rs"],
            reason: "a reason",
        }];
        let failure = judge(&crates, &other_crate).failure();
        assert!(
            failure.contains("2 import cycle(s) not in the allowlist"),
            "{failure}"
        );
        assert!(failure.contains("1 allowlist entry"), "{failure}");
    }

    #[test]
    fn the_lexer_drops_comments_strings_characters_and_lifetimes() {
        let source = "a /* b /* c */ d */ e // f\n'g' 'h: loop {} r#\"i\"# b\"j\" '\\'' b'k' \
                      fn l<'m>() r#try x::y 1.5 '{'";
        let tokens = lex(source);
        let idents: Vec<&str> = tokens
            .iter()
            .filter_map(|token| match &token.tok {
                Tok::Ident(word) => Some(word.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(idents, ["a", "e", "loop", "fn", "l", "try", "x", "y"]);
        let strings: Vec<&str> = tokens
            .iter()
            .filter_map(|token| match &token.tok {
                Tok::Str(text) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(strings, ["i", "j"]);
        let braces = tokens
            .iter()
            .filter(|token| token.tok == Tok::Punct('{'))
            .count();
        assert_eq!(braces, 1, "the '{{' character is no brace");
        let x = tokens
            .iter()
            .find(|token| token.tok == Tok::Ident("x".into()))
            .unwrap();
        assert_eq!(x.line, 2);
    }
}
