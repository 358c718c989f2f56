//! The arms of `--ab`: each a string of whitespace-separated `KEY=VALUE` environment
//! assignments and `--flags` for the child process.
//!
//! A token that starts with `-` is a flag; a plain token right after a flag is that flag's
//! value (`--threads 4`; `--threads=4` works too). A token of the form `NAME=VALUE` with `NAME`
//! a shell variable name is an environment assignment. Anything else is an error naming the
//! token, as are the flags the A/B driver sets itself for every child. There is no quoting:
//! values cannot contain whitespace.

use std::fmt;

/// Flags the A/B driver passes to every child itself (output format, one repetition, the
/// models) or that make no sense inside a child (nested A/B, an SVG or an allocator trace per
/// child).
const RESERVED: [&str; 16] = [
    "-o",
    "--output",
    "--json",
    "-r",
    "--repetitions",
    "--runs",
    "--ab",
    "--rounds",
    "--sweep",
    "--sweep-knobs",
    "--svg",
    "--alloc-trace",
    "--alloc-trace-capacity",
    "-m",
    "--model",
    "--help",
];

/// One arm: what to set in the child's environment and what to append to its arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Arm {
    /// The string as given, for the report.
    pub spec: String,
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
}

impl Arm {
    /// The arm as the report shows it (`(baseline)` for an empty arm).
    pub fn label(&self) -> String {
        let s = self.spec.split_whitespace().collect::<Vec<_>>().join(" ");
        if s.is_empty() {
            "(baseline)".to_string()
        } else {
            s
        }
    }
}

/// A token of an arm that is neither an assignment nor a flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArmError {
    pub spec: String,
    pub token: String,
    pub reason: String,
}

impl fmt::Display for ArmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--ab arm '{}': token '{}' {}; an arm is whitespace-separated KEY=VALUE \
             environment assignments and --flags (with their values)",
            self.spec, self.token, self.reason
        )
    }
}

impl std::error::Error for ArmError {}

fn is_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Parses one arm.
pub fn parse_arm(spec: &str) -> Result<Arm, ArmError> {
    let err = |token: &str, reason: &str| ArmError {
        spec: spec.to_string(),
        token: token.to_string(),
        reason: reason.to_string(),
    };
    let mut arm = Arm {
        spec: spec.to_string(),
        ..Arm::default()
    };
    // Whether the previous token was a flag without `=`, which may take this token as value.
    let mut after_flag = false;
    for token in spec.split_whitespace() {
        if token.starts_with('-') {
            if token == "-" || token == "--" {
                return Err(err(token, "is not a flag"));
            }
            let name = token.split('=').next().unwrap_or(token);
            if RESERVED.contains(&name) {
                return Err(err(
                    token,
                    "is set by the A/B driver for every child and cannot differ between arms",
                ));
            }
            after_flag = !token.contains('=');
            arm.args.push(token.to_string());
        } else if let Some((key, value)) = token.split_once('=') {
            if !is_var_name(key) {
                return Err(err(
                    token,
                    "assigns to something that is not a variable name",
                ));
            }
            arm.env.push((key.to_string(), value.to_string()));
            after_flag = false;
        } else if after_flag {
            arm.args.push(token.to_string());
            after_flag = false;
        } else {
            return Err(err(token, "is neither KEY=VALUE nor a --flag or its value"));
        }
    }
    Ok(arm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_the_baseline() {
        let a = parse_arm("").unwrap();
        assert!(a.env.is_empty() && a.args.is_empty());
        assert_eq!(a.label(), "(baseline)");
        assert_eq!(parse_arm("  \t ").unwrap().label(), "(baseline)");
    }

    #[test]
    fn assignments_flags_and_flag_values() {
        let a = parse_arm("HIPDECODE_FOO=1  --no-graph --threads 4 X_2= --exact -p=64").unwrap();
        assert_eq!(
            a.env,
            vec![
                ("HIPDECODE_FOO".to_string(), "1".to_string()),
                ("X_2".to_string(), String::new()),
            ]
        );
        assert_eq!(
            a.args,
            ["--no-graph", "--threads", "4", "--exact", "-p=64"].map(String::from)
        );
        assert_eq!(
            a.label(),
            "HIPDECODE_FOO=1 --no-graph --threads 4 X_2= --exact -p=64"
        );
        // A value may contain '=' (only the first one splits).
        let a = parse_arm("OPTS=a=b").unwrap();
        assert_eq!(a.env, vec![("OPTS".to_string(), "a=b".to_string())]);
    }

    #[test]
    fn malformed_tokens_are_errors_naming_the_token() {
        for (spec, token) in [
            ("foo", "foo"),
            ("HIPDECODE_FOO=1 bar", "bar"),
            ("--threads=4 5", "5"),
            ("=1", "=1"),
            ("1X=2", "1X=2"),
            ("A-B=1", "A-B=1"),
            ("-", "-"),
            ("--exact --", "--"),
        ] {
            let e = parse_arm(spec).unwrap_err();
            assert_eq!(e.token, token, "{spec}");
            let text = e.to_string();
            assert!(text.contains(&format!("'{token}'")), "{text}");
        }
    }

    #[test]
    fn driver_flags_are_refused() {
        for spec in [
            "-o csv",
            "--output=md",
            "-r 3",
            "--ab x",
            "--svg f.svg",
            "-m x",
        ] {
            let e = parse_arm(spec).unwrap_err();
            assert!(e.reason.contains("A/B driver"), "{spec}: {e}");
        }
    }
}
