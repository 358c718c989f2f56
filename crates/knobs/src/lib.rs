//! The `HIPDECODE_*` environment variables ("knobs"), each defined once.
//!
//! A crate that reads a variable defines it as a [`Knob`] in its own table (a `knobs` module
//! with a `TABLE`), so the crate still works on its own: the knob carries its name, its parser,
//! its default (in the text form the parser reads, so the documented default is the one used)
//! and a one-line doc. Reading goes through the knob, never through `std::env` directly, and
//! this crate is the one place that touches the process environment for these names.
//!
//! A program gathers the tables of the crates it links, then:
//! - [`check`] parses every variable that is set, so a malformed value is an error at start-up
//!   whatever the run goes on to use, and warns about a `HIPDECODE_` name no table defines (a
//!   typo);
//! - [`listing`] shows each knob with its value in this environment (`hipdecode env`);
//! - [`markdown_table`] renders the table that docs/memory.md carries.
//!
//! Unset and empty are the same: both mean the default.

use std::ffi::OsString;
use std::fmt::Write as _;

/// The prefix every knob's name starts with; a set variable with it that no table defines is
/// reported as a likely typo.
pub const PREFIX: &str = "HIPDECODE_";

/// What a knob is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Changes what a run does or how it is bounded.
    Run,
    /// Read by tests only: what a test machine requires, or where its inputs are.
    Test,
}

impl Scope {
    pub fn label(self) -> &'static str {
        match self {
            Scope::Run => "run",
            Scope::Test => "test",
        }
    }
}

/// A variable's value that its knob's parser refused, or one that is not UTF-8.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KnobError {
    #[error("{name}={value:?} is not valid: {reason}")]
    Invalid {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error(
        "{name} is set to a value that is not UTF-8; set it to one of the values its doc names"
    )]
    NotUnicode { name: &'static str },
}

/// One environment variable: its name, how its value is read, the value used when it is unset,
/// and what it does.
pub struct Knob<T: 'static> {
    pub name: &'static str,
    /// The value used when the variable is unset or empty, in the form `parse` reads ("" where
    /// unset means "none"; `parse` then accepts "").
    pub default: &'static str,
    /// One line: what the knob does and the values it takes.
    pub doc: &'static str,
    pub scope: Scope,
    /// Reads a value; the error is the reason, naming the accepted forms (the caller adds the
    /// variable's name and value).
    pub parse: fn(&str) -> Result<T, String>,
}

impl<T> Knob<T> {
    /// The knob's value in `env`: the variable's, or the default when it is unset or empty.
    pub fn value(&self, env: &Env) -> Result<T, KnobError> {
        self.parse_or_default(env.get(self.name)?)
    }

    /// The value the knob takes when its variable holds `text` (unset when empty).
    pub fn value_of(&self, text: &str) -> Result<T, KnobError> {
        self.parse_or_default(Some(text).filter(|t| !t.is_empty()))
    }

    /// The knob's value in the process environment (see [`Knob::value`]).
    pub fn read(&self) -> Result<T, KnobError> {
        self.parse_or_default(Env::read_one(self.name)?.as_deref())
    }

    /// Whether the variable is set (to a non-empty value) in the process environment.
    pub fn is_set(&self) -> bool {
        matches!(Env::read_one(self.name), Ok(Some(_)) | Err(_))
    }

    fn parse_or_default(&self, set: Option<&str>) -> Result<T, KnobError> {
        let text = set.unwrap_or(self.default);
        (self.parse)(text).map_err(|reason| KnobError::Invalid {
            name: self.name,
            value: text.to_string(),
            reason,
        })
    }
}

/// A knob of any value type, as the tables hold it.
pub trait AnyKnob: Sync {
    fn name(&self) -> &'static str;
    fn default_text(&self) -> &'static str;
    fn doc(&self) -> &'static str;
    fn scope(&self) -> Scope;
    /// Parses `value` and drops the result: whether the knob accepts it.
    fn check(&self, value: &str) -> Result<(), KnobError>;
}

impl<T> AnyKnob for Knob<T> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn default_text(&self) -> &'static str {
        self.default
    }
    fn doc(&self) -> &'static str {
        self.doc
    }
    fn scope(&self) -> Scope {
        self.scope
    }
    fn check(&self, value: &str) -> Result<(), KnobError> {
        self.value_of(value).map(drop)
    }
}

/// One crate's knobs.
pub type Table = &'static [&'static dyn AnyKnob];

/// A snapshot of the `HIPDECODE_*` variables, read once (or given, in tests).
#[derive(Clone, Debug, Default)]
pub struct Env {
    /// Name and value; `None` for a value that is not UTF-8.
    vars: Vec<(String, Option<String>)>,
}

impl Env {
    /// The process's `HIPDECODE_*` variables now.
    pub fn process() -> Env {
        let vars = std::env::vars_os()
            .filter_map(|(k, v): (OsString, OsString)| {
                let k = k.into_string().ok()?;
                k.starts_with(PREFIX).then(|| (k, v.into_string().ok()))
            })
            .collect();
        Env { vars }
    }

    /// An environment holding exactly `pairs`.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Env {
        let vars = pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), Some(v.to_string())))
            .collect();
        Env { vars }
    }

    /// The value of `name`, `None` when unset or empty.
    pub fn get(&self, name: &'static str) -> Result<Option<&str>, KnobError> {
        match self.vars.iter().rev().find(|(k, _)| k == name) {
            None => Ok(None),
            Some((_, None)) => Err(KnobError::NotUnicode { name }),
            Some((_, Some(v))) => Ok(Some(v.as_str()).filter(|v| !v.is_empty())),
        }
    }

    /// The names set (with the prefix), in the order given.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.vars.iter().map(|(k, _)| k.as_str())
    }

    fn read_one(name: &'static str) -> Result<Option<String>, KnobError> {
        match std::env::var_os(name) {
            None => Ok(None),
            Some(v) => match v.into_string() {
                Ok(v) => Ok(Some(v).filter(|v| !v.is_empty())),
                Err(_) => Err(KnobError::NotUnicode { name }),
            },
        }
    }
}

/// Every knob of `tables`, in table order.
pub fn all(tables: &[Table]) -> impl Iterator<Item = &'static dyn AnyKnob> + '_ {
    tables.iter().flat_map(|t| t.iter().copied())
}

/// Parses every variable of `env` that a knob of `tables` defines, failing on the first
/// malformed one; returns a warning for each `HIPDECODE_` name that no table defines.
pub fn check(tables: &[Table], env: &Env) -> Result<Vec<String>, KnobError> {
    for knob in all(tables) {
        if let Some(value) = env.get(knob.name())? {
            knob.check(value)?;
        }
    }
    let known: Vec<&str> = all(tables).map(|k| k.name()).collect();
    Ok(env
        .names()
        .filter(|name| !known.contains(name))
        .map(|name| {
            let near = nearest(name, &known)
                .map(|n| format!("did you mean {n}? "))
                .unwrap_or_default();
            format!(
                "{name} is set but nothing reads it; {near}`hipdecode env` lists the known \
                 variables"
            )
        })
        .collect())
}

/// The known name closest to `name` by edit distance, when it is close enough to be a typo.
fn nearest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .filter(|&(d, _)| d <= 3)
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The default as the listing and the docs show it: "unset" where unset means none.
fn default_label(knob: &dyn AnyKnob) -> Option<&'static str> {
    Some(knob.default_text()).filter(|d| !d.is_empty())
}

/// Each knob with its value in `env` (or its default), for `hipdecode env`.
pub fn listing(tables: &[Table], env: &Env) -> String {
    let width = all(tables).map(|k| k.name().len()).max().unwrap_or(0);
    let mut out = String::new();
    for scope in [Scope::Run, Scope::Test] {
        let _ = writeln!(out, "{} knobs:", scope.label());
        for knob in all(tables).filter(|k| k.scope() == scope) {
            let value = match env.get(knob.name()) {
                Ok(Some(v)) => format!("= {v}"),
                Ok(None) => format!("(default: {})", default_label(knob).unwrap_or("unset")),
                Err(e) => format!("({e})"),
            };
            let _ = writeln!(out, "  {:width$}  {value}", knob.name());
            let _ = writeln!(out, "  {:width$}  {}", "", knob.doc());
        }
    }
    out
}

/// The knobs of `tables` as a Markdown table (name, default, scope, doc).
pub fn markdown_table(tables: &[Table]) -> String {
    let mut out =
        String::from("| variable | default | for | what it does |\n| --- | --- | --- | --- |\n");
    for knob in all(tables) {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            knob.name(),
            default_label(knob).map_or("unset".to_string(), |d| format!("`{d}`")),
            knob.scope().label(),
            knob.doc().replace('|', "\\|")
        );
    }
    out
}

/// Checks a set of tables for what the registry promises: each name once, with the prefix, a
/// doc, and a default its own parser accepts. For the tests of the crates that gather tables.
pub fn validate(tables: &[Table]) -> Result<(), String> {
    let mut seen: Vec<&str> = Vec::new();
    for knob in all(tables) {
        let name = knob.name();
        if !name.starts_with(PREFIX) {
            return Err(format!("{name} does not start with {PREFIX}"));
        }
        if seen.contains(&name) {
            return Err(format!("{name} is defined twice"));
        }
        seen.push(name);
        if knob.doc().trim().is_empty() {
            return Err(format!("{name} has no doc"));
        }
        let default = knob.default_text();
        knob.check(default)
            .map_err(|e| format!("{name}'s default {default:?} is refused by its parser: {e}"))?;
    }
    Ok(())
}

/// Parsers shared by the crates' knobs.
pub mod parse {
    /// `0`, `1` or unset (`""`): a switch that is off unless set to 1.
    pub fn switch(value: &str) -> Result<bool, String> {
        match value.trim() {
            "" | "0" => Ok(false),
            "1" => Ok(true),
            _ => Err("use 1 (on) or 0 / empty / unset (off)".into()),
        }
    }

    /// One of `choices` by name; the reason lists them.
    pub fn choice<T: Copy>(value: &str, choices: &[(&str, T)]) -> Result<T, String> {
        let wanted = value.trim();
        choices
            .iter()
            .find(|(name, _)| *name == wanted)
            .map(|&(_, v)| v)
            .ok_or_else(|| {
                let names: Vec<String> = choices.iter().map(|(n, _)| format!("'{n}'")).collect();
                format!("use one of {}", names.join(", "))
            })
    }

    /// Any text, `None` when unset (a path, a list).
    pub fn text(value: &str) -> Result<Option<String>, String> {
        Ok(Some(value.to_string()).filter(|v| !v.is_empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Mode {
        Fast,
        Slow,
    }

    static MODE: Knob<Mode> = Knob {
        name: "HIPDECODE_TEST_MODE",
        default: "fast",
        doc: "fast or slow",
        scope: Scope::Run,
        parse: |v| parse::choice(v, &[("fast", Mode::Fast), ("slow", Mode::Slow)]),
    };
    static FLAG: Knob<bool> = Knob {
        name: "HIPDECODE_TEST_FLAG",
        default: "",
        doc: "a switch",
        scope: Scope::Test,
        parse: parse::switch,
    };
    static TABLE: Table = &[&MODE, &FLAG];

    #[test]
    fn unset_and_empty_give_the_default_and_a_value_is_parsed() {
        assert_eq!(MODE.value(&Env::default()), Ok(Mode::Fast));
        let env = Env::from_pairs([("HIPDECODE_TEST_MODE", "")]);
        assert_eq!(MODE.value(&env), Ok(Mode::Fast));
        let env = Env::from_pairs([("HIPDECODE_TEST_MODE", " slow ")]);
        assert_eq!(MODE.value(&env), Ok(Mode::Slow));
        let env = Env::from_pairs([("HIPDECODE_TEST_MODE", "SLOW")]);
        assert!(MODE.value(&env).is_err(), "choices are matched exactly");
        assert_eq!(FLAG.value(&Env::default()), Ok(false));
    }

    #[test]
    fn a_bad_value_names_the_variable_the_value_and_the_choices() {
        let env = Env::from_pairs([("HIPDECODE_TEST_MODE", "medium")]);
        let e = MODE.value(&env).unwrap_err().to_string();
        for word in ["HIPDECODE_TEST_MODE", "\"medium\"", "'fast'", "'slow'"] {
            assert!(e.contains(word), "{word} missing from {e}");
        }
        let e = check(&[TABLE], &env).unwrap_err().to_string();
        assert!(e.contains("medium"), "{e}");
    }

    #[test]
    fn an_unknown_name_is_a_warning_with_the_nearest_known_one() {
        let env = Env::from_pairs([("HIPDECODE_TEST_MOD", "fast"), ("HIPDECODE_TEST_FLAG", "1")]);
        let w = check(&[TABLE], &env).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("HIPDECODE_TEST_MOD "), "{}", w[0]);
        assert!(
            w[0].contains("did you mean HIPDECODE_TEST_MODE?"),
            "{}",
            w[0]
        );
        let far = Env::from_pairs([("HIPDECODE_SOMETHING_ELSE", "1")]);
        let w = check(&[TABLE], &far).unwrap();
        assert!(!w[0].contains("did you mean"), "{}", w[0]);
    }

    #[test]
    fn validate_refuses_a_duplicate_and_a_default_the_parser_refuses() {
        assert_eq!(validate(&[TABLE]), Ok(()));
        let e = validate(&[TABLE, TABLE]).unwrap_err();
        assert!(e.contains("defined twice"), "{e}");
        static BAD: Knob<Mode> = Knob {
            name: "HIPDECODE_TEST_BAD",
            default: "quick",
            doc: "a default its parser refuses",
            scope: Scope::Run,
            parse: |v| parse::choice(v, &[("fast", Mode::Fast)]),
        };
        static BAD_TABLE: Table = &[&BAD];
        let e = validate(&[BAD_TABLE]).unwrap_err();
        assert!(e.contains("quick"), "{e}");
    }

    #[test]
    fn listing_and_markdown_show_every_knob_and_the_set_value() {
        let env = Env::from_pairs([("HIPDECODE_TEST_FLAG", "1")]);
        let l = listing(&[TABLE], &env);
        assert!(
            l.contains("HIPDECODE_TEST_MODE") && l.contains("(default: fast)"),
            "{l}"
        );
        assert!(
            l.contains("HIPDECODE_TEST_FLAG") && l.contains("= 1"),
            "{l}"
        );
        let md = markdown_table(&[TABLE]);
        assert_eq!(md.lines().count(), 4, "{md}");
        assert!(
            md.contains("| `HIPDECODE_TEST_FLAG` | unset | test | a switch |"),
            "{md}"
        );
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("abc", "abd"), 1);
        assert_eq!(edit_distance("abc", "ab"), 1);
        assert_eq!(edit_distance("CACHE_LIMT", "CACHE_LIMIT"), 1);
    }
}

/// The README's examples, run as doc tests so the README stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
