//! Wave-size audit (issue 28, item 3): every kernel that assumes a warp or wave width takes it
//! from `WARP_SIZE`, the host's `-DWARP_SIZE=<32|64>`.
//!
//! A source check over every file the kernel programs are made of (the crate's own list,
//! `rocm_kernels::source::bundled_files`, so a new module or header is covered without being
//! named here). It reports a fixed lane count where one decides which lanes work together:
//!
//! * lane arithmetic: a literal 31, 32, 63 or 64 (or 0xffffffff) as the other operand of a lane,
//!   warp, wave or thread index (`threadIdx.x % 32`, `lane & 31`, `warp * 32`, `tid < 64`);
//! * shuffles: a literal width or lane (`__shfl_xor(v, m, 32)`) and a 32-bit full mask
//!   (`__shfl_xor_sync(0xffffffff, …)`: 64 lanes need a 64-bit mask);
//! * ballots kept in a 32-bit type (a wave of 64 has a 64-bit ballot);
//! * arrays whose size is a literal 31, 32, 63 or 64 (per-warp scratch must follow the wave);
//! * butterfly loops over shuffles that start from a literal 16 or more (a reduction over 32 or
//!   more lanes written for one wave size);
//! * the run-time `warpSize`, which is not the compile-time constant the kernels are built for.
//!
//! Many such literals are right on purpose (32 values of a quantized group on 32 lanes of any
//! wave, per-warp arrays sized for the most warps a block can have). Those are listed in
//! [`ALLOWED`] by file and a piece of the line's code (not a line number, which drifts), each
//! with its reason. The test fails on any finding not listed, and on any entry that matches
//! nothing any more, so the list cannot outlive the code it excuses.

use std::collections::BTreeSet;
use std::path::Path;

/// Why a line was reported, and what to write instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Rule {
    LaneArithmetic,
    ShuffleLiteral,
    LaneMask32,
    BallotIn32Bits,
    ArraySizedByLiteral,
    ButterflyFromLiteral,
    RuntimeWarpSize,
}

impl Rule {
    fn explain(self) -> &'static str {
        match self {
            Rule::LaneArithmetic => {
                "a fixed lane count next to a lane/warp/thread index; derive it from WARP_SIZE \
                 (threadIdx.x % WARP_SIZE, threadIdx.x / WARP_SIZE)"
            }
            Rule::ShuffleLiteral => {
                "a literal width or lane in a shuffle; pass WARP_SIZE (the portability.h \
                 warp_shfl* helpers do)"
            }
            Rule::LaneMask32 => {
                "a 32-bit all-lanes mask; a wave of 64 needs 64 bits: use the mask-free \
                 portability.h helpers, or a mask built from WARP_SIZE"
            }
            Rule::BallotIn32Bits => {
                "a ballot kept in 32 bits drops lanes 32..63 of a wave of 64; keep it in a u64"
            }
            Rule::ArraySizedByLiteral => {
                "an array sized by a literal lane count; size per-lane or per-warp storage from \
                 WARP_SIZE (or list it with the reason the literal is right)"
            }
            Rule::ButterflyFromLiteral => {
                "a shuffle reduction that starts from a literal of 16 or more spans a fixed \
                 number of lanes; start it from WARP_SIZE / 2 (or list it with the reason)"
            }
            Rule::RuntimeWarpSize => {
                "warpSize is a run-time value; the kernels are compiled for WARP_SIZE"
            }
        }
    }
}

/// One suspicious line.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Finding {
    file: String,
    line: usize,
    rule: Rule,
    /// The line without comments, trimmed.
    code: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: {:?}: `{}`\n    {}",
            self.file,
            self.line,
            self.rule,
            self.code,
            self.rule.explain()
        )
    }
}

/// A finding that is right on purpose: every finding in `file` whose code contains `code`.
#[derive(Debug)]
struct Allowed {
    file: &'static str,
    code: &'static str,
    reason: &'static str,
}

impl Allowed {
    fn covers(&self, finding: &Finding) -> bool {
        finding.file == self.file && finding.code.contains(self.code)
    }
}

/// Per-warp scratch: one slot per warp of a block. 1024 threads in waves of 32 (the narrower
/// wave) are 32 warps, so 32 slots hold every warp on either wave size; a wave of 64 uses 16.
const MOST_WARPS: &str = "one slot per warp: 1024 threads / 32 lanes (the narrower wave) is the \
                          most warps a block has, on either wave size";

/// The reviewed findings.
const ALLOWED: &[Allowed] = &[
    Allowed {
        file: "portability.h",
        code: "__shfl_xor_sync(0xffffffffu, v, lane_mask, WARP_SIZE)",
        reason: "the CUDA branch (#if defined(__CUDACC__)): an NVIDIA warp is always 32 lanes, \
                 so all lanes are 32 bits; the HIP branch passes no mask",
    },
    Allowed {
        file: "portability.h",
        code: "__shfl_sync(0xffffffffu, v, src_lane, WARP_SIZE)",
        reason: "the CUDA branch, as above",
    },
    Allowed {
        file: "portability.h",
        code: "for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, warp_shfl_xor(amax, m));",
        reason: "q8_quantize_lane: a group of 32 activations on 32 consecutive lanes (half a wave \
                 of 64); xor masks below 32 stay inside the group on either wave size",
    },
    Allowed {
        file: "kv_q8.h",
        code: "for (int m = 16; m > 0; m >>= 1) {",
        reason: "kv_q8_store_lane: a q8_0 block of 32 values on 32 consecutive lanes; xor masks \
                 below 32 stay inside the block on either wave size",
    },
    Allowed {
        file: "norm.hip",
        code: "__shared__ float scratch[32];",
        reason: MOST_WARPS,
    },
    Allowed {
        file: "sampling.hip",
        code: "__shared__ u64 scratch[32];",
        reason: MOST_WARPS,
    },
    Allowed {
        file: "sampling.hip",
        code: "u32 red32[32];",
        reason: MOST_WARPS,
    },
    Allowed {
        file: "sampling.hip",
        code: "u64 red64[32];",
        reason: MOST_WARPS,
    },
    Allowed {
        file: "attention.hip",
        code: "__shared__ float red[ATTN_MAX_HEADS * 32];",
        reason: MOST_WARPS,
    },
    Allowed {
        file: "attention.hip",
        code: "red[g * 32 + warp]",
        reason: "the stride of one head's slots in `red`, one slot per warp (see red's size)",
    },
    Allowed {
        file: "matvec.hip",
        code: "__shared__ float partial[32][MATVEC_MAX_TOKENS];",
        reason: MOST_WARPS,
    },
    Allowed {
        file: "matvec_q8.hip",
        code: "__shared__ float partial[32][MAXT];",
        reason: MOST_WARPS,
    },
    Allowed {
        file: "matvec_q8.hip",
        code: "__shared__ float slot_sum[32];",
        reason: "one slot per wave of moe_down_q8's block, k <= 16 waves (MOE_DOWN_MAX_K); 32 \
                 covers the most warps any block has",
    },
];

// ---- Lexing ----------------------------------------------------------------------------

/// The source with comments and the contents of string and character literals blanked, line
/// for line (so line numbers stay), as a list of lines.
fn code_lines(text: &str) -> Vec<String> {
    #[derive(PartialEq)]
    enum State {
        Code,
        LineComment,
        BlockComment,
        Str,
        Char,
    }
    let mut state = State::Code;
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match state {
            State::Code => match (c, next) {
                ('/', Some('/')) => {
                    state = State::LineComment;
                    i += 1;
                }
                ('/', Some('*')) => {
                    state = State::BlockComment;
                    out.push(' ');
                    i += 1;
                }
                ('"', _) => {
                    state = State::Str;
                    out.push('"');
                }
                ('\'', _) => {
                    state = State::Char;
                    out.push('\'');
                }
                _ => out.push(c),
            },
            State::LineComment => {
                if c == '\n' {
                    state = State::Code;
                    out.push('\n');
                }
            }
            State::BlockComment => {
                if c == '*' && next == Some('/') {
                    state = State::Code;
                    i += 1;
                } else if c == '\n' {
                    out.push('\n');
                }
            }
            State::Str | State::Char => {
                let end = if state == State::Str { '"' } else { '\'' };
                if c == '\\' {
                    out.push(' ');
                    if next.is_some_and(|n| n != '\n') {
                        out.push(' ');
                        i += 1;
                    }
                } else if c == end {
                    state = State::Code;
                    out.push(end);
                } else if c == '\n' {
                    // An unterminated literal ends with its line, as the compiler would.
                    state = State::Code;
                    out.push('\n');
                } else {
                    out.push(' ');
                }
            }
        }
        i += 1;
    }
    out.split('\n').map(str::to_string).collect()
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Number(String),
    Punct(&'static str),
}

const PUNCTS: [&str; 47] = [
    ">>=", "<<=", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+=", "-=",
    "*=", "/=", "%=", "&=", "|=", "^=", "::", "(", ")", "[", "]", "{", "}", ",", ";", ".", "+",
    "-", "*", "/", "%", "&", "|", "^", "!", "~", "<", ">", "=", "?", ":", "#",
];

fn tokens(line: &str) -> Vec<Tok> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() || c == '"' || c == '\'' || c == '\\' {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let start = i;
            while i < chars.len() {
                let d = chars[i];
                let exponent_sign = (d == '+' || d == '-')
                    && matches!(chars[i - 1], 'e' | 'E' | 'p' | 'P')
                    && !chars[start..i].iter().collect::<String>().starts_with("0x");
                if d.is_ascii_alphanumeric() || d == '_' || d == '.' || exponent_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            out.push(Tok::Number(chars[start..i].iter().collect()));
        } else {
            let rest: String = chars[i..chars.len().min(i + 3)].iter().collect();
            match PUNCTS.iter().find(|p| rest.starts_with(**p)) {
                Some(p) => {
                    out.push(Tok::Punct(p));
                    i += p.len();
                }
                None => i += 1,
            }
        }
    }
    out
}

/// The value of an integer literal (suffixes dropped); `None` for anything else.
fn integer_value(literal: &str) -> Option<u64> {
    let digits = literal.trim_end_matches(['u', 'U', 'l', 'L']);
    match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => digits.parse().ok(),
    }
}

/// A literal that reads as a lane count or the last lane of a wave.
fn is_lane_count(tok: &Tok) -> bool {
    matches!(tok, Tok::Number(n) if matches!(integer_value(n), Some(31 | 32 | 63 | 64)))
}

/// A literal with 32 set bits: all lanes of a wave of 32 and no more.
fn is_mask32(tok: &Tok) -> bool {
    matches!(tok, Tok::Number(n) if integer_value(n) == Some(0xffff_ffff))
}

/// A name that holds a lane, warp, wave or thread index or count. WARP_SIZE itself is the
/// sanctioned spelling, so literals beside it (`#if WARP_SIZE != 32`) are fine.
fn is_lane_name(name: &str) -> bool {
    if name == "WARP_SIZE" {
        return false;
    }
    let lower = name.to_ascii_lowercase();
    ["lane", "warp", "wave", "thread"]
        .iter()
        .any(|w| lower.contains(w))
        || name == "tid"
        || name == "blockDim"
}

fn is_shuffle(name: &str) -> bool {
    name.to_ascii_lowercase().contains("shfl")
}

fn is_ballot(name: &str) -> bool {
    name.starts_with("__ballot") || name == "__activemask"
}

/// Warp-wide intrinsics that take or give a lane mask.
fn takes_lane_mask(name: &str) -> bool {
    is_shuffle(name)
        || is_ballot(name)
        || name == "__syncwarp"
        || name.starts_with("__any")
        || name.starts_with("__all")
        || name.starts_with("__match")
        || name.starts_with("__reduce")
}

/// Operators whose other operand a lane-count literal is checked against. Shifts are left out:
/// `v >> 32` splits a 64-bit value, whatever the wave.
const OPERATORS: [&str; 22] = [
    "%", "&", "/", "*", "+", "-", "<", "<=", ">", ">=", "==", "!=", "|", "^", "=", "%=", "&=",
    "/=", "*=", "+=", "-=", "|=",
];

fn is_operator(tok: &Tok) -> bool {
    matches!(tok, Tok::Punct(p) if OPERATORS.contains(p))
}

/// Type names a parenthesised cast may hold.
const TYPES: [&str; 16] = [
    "u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "int", "unsigned", "long", "short",
    "char", "float", "double", "const",
];

const INT32_TYPES: [&str; 6] = ["u32", "i32", "int", "unsigned", "uint32_t", "int32_t"];

/// Index of the bracket that closes the one at `open` (or the end of the line).
fn closing(toks: &[Tok], open: usize) -> usize {
    let (o, c) = match toks[open] {
        Tok::Punct("[") => ("[", "]"),
        _ => ("(", ")"),
    };
    let mut depth = 0;
    for (i, t) in toks.iter().enumerate().skip(open) {
        if *t == Tok::Punct(o) {
            depth += 1;
        } else if *t == Tok::Punct(c) {
            depth -= 1;
            if depth == 0 {
                return i;
            }
        }
    }
    toks.len()
}

/// Index of the bracket that opens the one at `close`.
fn opening(toks: &[Tok], close: usize) -> Option<usize> {
    let (o, c) = match toks[close] {
        Tok::Punct("]") => ("[", "]"),
        _ => ("(", ")"),
    };
    let mut depth = 0;
    for i in (0..=close).rev() {
        if toks[i] == Tok::Punct(c) {
            depth += 1;
        } else if toks[i] == Tok::Punct(o) {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

fn idents(toks: &[Tok]) -> impl Iterator<Item = &str> {
    toks.iter().filter_map(|t| match t {
        Tok::Ident(s) => Some(s.as_str()),
        _ => None,
    })
}

fn is_cast(group: &[Tok]) -> bool {
    !group.is_empty()
        && group.iter().all(|t| {
            matches!(t, Tok::Ident(s) if TYPES.contains(&s.as_str())) || *t == Tok::Punct("*")
        })
}

/// The names in the operand that ends at `end` (a name with its `.`/`->` chain, or a
/// bracketed group with the call or array name before it).
fn operand_before(toks: &[Tok], end: usize) -> Vec<&str> {
    match &toks[end] {
        Tok::Ident(_) => {
            let mut start = end;
            while start >= 2
                && matches!(toks[start - 1], Tok::Punct("." | "->"))
                && matches!(toks[start - 2], Tok::Ident(_))
            {
                start -= 2;
            }
            idents(&toks[start..=end]).collect()
        }
        Tok::Punct(")" | "]") => match opening(toks, end) {
            Some(open) => {
                let from = if open > 0 && matches!(toks[open - 1], Tok::Ident(_)) {
                    open - 1
                } else {
                    open
                };
                idents(&toks[from..=end]).collect()
            }
            None => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// The names in the operand that starts at `start`, skipping casts.
fn operand_after(toks: &[Tok], start: usize) -> Vec<&str> {
    let mut i = start;
    loop {
        match toks.get(i) {
            Some(Tok::Ident(_)) => {
                let mut end = i;
                while end + 2 < toks.len()
                    && matches!(toks[end + 1], Tok::Punct("." | "->"))
                    && matches!(toks[end + 2], Tok::Ident(_))
                {
                    end += 2;
                }
                if matches!(toks.get(end + 1), Some(Tok::Punct("(" | "["))) {
                    end = closing(toks, end + 1).min(toks.len() - 1);
                }
                return idents(&toks[i..=end]).collect();
            }
            Some(Tok::Punct("(")) => {
                let close = closing(toks, i);
                if is_cast(&toks[i + 1..close.min(toks.len())]) && close < toks.len() {
                    i = close + 1;
                    continue;
                }
                return idents(&toks[i..close.min(toks.len())]).collect();
            }
            _ => return Vec::new(),
        }
    }
}

/// The top-level arguments of the call whose `(` is at `open`.
fn call_args(toks: &[Tok], open: usize) -> Vec<&[Tok]> {
    let close = closing(toks, open);
    let mut args = Vec::new();
    let mut depth = 0;
    let mut from = open + 1;
    for i in open + 1..close.min(toks.len()) {
        match toks[i] {
            Tok::Punct("(" | "[") => depth += 1,
            Tok::Punct(")" | "]") => depth -= 1,
            Tok::Punct(",") if depth == 0 => {
                args.push(&toks[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    args.push(&toks[from..close.min(toks.len())]);
    args
}

// ---- The scan ----------------------------------------------------------------------------

/// Every finding in one file.
fn scan(file: &str, text: &str) -> Vec<Finding> {
    let lines = code_lines(text);
    let toks: Vec<Vec<Tok>> = lines.iter().map(|l| tokens(l)).collect();
    let mut found = BTreeSet::new();
    for (n, line) in toks.iter().enumerate() {
        let mut report = |rule: Rule| {
            found.insert(Finding {
                file: file.to_string(),
                line: n + 1,
                rule,
                code: lines[n].trim().to_string(),
            });
        };
        for (i, tok) in line.iter().enumerate() {
            // A lane count, or a 32-bit mask, as the other operand of a lane index.
            if is_lane_count(tok) || is_mask32(tok) {
                let mut beside = Vec::new();
                if i >= 2 && is_operator(&line[i - 1]) {
                    beside.extend(operand_before(line, i - 2));
                }
                if i + 2 < line.len() && is_operator(&line[i + 1]) {
                    beside.extend(operand_after(line, i + 2));
                }
                if beside.iter().any(|name| is_lane_name(name)) {
                    report(if is_mask32(tok) {
                        Rule::LaneMask32
                    } else {
                        Rule::LaneArithmetic
                    });
                }
                if is_mask32(tok) && beside.iter().any(|name| takes_lane_mask(name)) {
                    report(Rule::LaneMask32);
                }
            }
            let Tok::Ident(name) = tok else {
                continue;
            };
            if name == "warpSize" {
                report(Rule::RuntimeWarpSize);
            }
            let calls = matches!(line.get(i + 1), Some(Tok::Punct("(")));
            if calls && takes_lane_mask(name) {
                for arg in call_args(line, i + 1) {
                    if let [lit] = arg {
                        if is_mask32(lit) {
                            report(Rule::LaneMask32);
                        } else if is_shuffle(name) && is_lane_count(lit) {
                            report(Rule::ShuffleLiteral);
                        }
                    }
                }
            }
            if calls && is_ballot(name) {
                // `u32 m = __ballot(…)` or `(u32)__ballot(…)`.
                let declared_32 = i >= 3
                    && line[i - 1] == Tok::Punct("=")
                    && matches!(&line[i - 3], Tok::Ident(t) if INT32_TYPES.contains(&t.as_str()));
                let cast_32 = i >= 1
                    && line[i - 1] == Tok::Punct(")")
                    && opening(line, i - 1).is_some_and(|open| {
                        idents(&line[open..i]).any(|t| INT32_TYPES.contains(&t))
                            && is_cast(&line[open + 1..i - 1])
                    });
                if declared_32 || cast_32 {
                    report(Rule::BallotIn32Bits);
                }
            }
            // An array declaration `T name[… 32 …]`: a type (or `*`) before the name.
            let declares = i >= 1
                && matches!(line.get(i + 1), Some(Tok::Punct("[")))
                && match &line[i - 1] {
                    Tok::Ident(t) => !matches!(
                        t.as_str(),
                        "return" | "case" | "else" | "sizeof" | "goto" | "do"
                    ),
                    Tok::Punct("*") => i >= 2 && matches!(line[i - 2], Tok::Ident(_)),
                    _ => false,
                };
            if declares {
                // Every dimension: name[a][b]…
                let mut open = i + 1;
                while matches!(line.get(open), Some(Tok::Punct("["))) {
                    let close = closing(line, open);
                    if line[open + 1..close.min(line.len())]
                        .iter()
                        .any(is_lane_count)
                    {
                        report(Rule::ArraySizedByLiteral);
                    }
                    open = close + 1;
                }
            }
            // `for (int m = 16; m > 0; m >>= 1)` with a shuffle in the loop.
            if name == "for" && matches!(line.get(i + 1), Some(Tok::Punct("("))) {
                let close = closing(line, i + 1);
                let header = &line[i + 2..close.min(line.len())];
                let start = header
                    .iter()
                    .position(|t| *t == Tok::Punct("="))
                    .and_then(|eq| header.get(eq + 1).zip(header.get(eq + 2)));
                let halves = header.windows(2).any(|w| {
                    w == [Tok::Punct(">>="), Tok::Number("1".into())]
                        || w == [Tok::Punct("/="), Tok::Number("2".into())]
                });
                if let Some((Tok::Number(lit), Tok::Punct(";"))) = start {
                    let body_has_shuffle = line[close.min(line.len())..]
                        .iter()
                        .chain(toks.iter().skip(n + 1).take(2).flatten())
                        .any(|t| matches!(t, Tok::Ident(s) if is_shuffle(s)));
                    if halves && body_has_shuffle && integer_value(lit).is_some_and(|v| v >= 16) {
                        report(Rule::ButterflyFromLiteral);
                    }
                }
            }
        }
    }
    found.into_iter().collect()
}

/// What the audit of some files found: findings no entry covers, and entries that cover
/// nothing.
#[derive(Debug)]
struct Audit<'a> {
    unlisted: Vec<Finding>,
    stale: Vec<&'a Allowed>,
}

fn audit<'a>(files: &[(&str, &str)], allowed: &'a [Allowed]) -> Audit<'a> {
    let findings: Vec<Finding> = files
        .iter()
        .flat_map(|(name, text)| scan(name, text))
        .collect();
    Audit {
        unlisted: findings
            .iter()
            .filter(|f| !allowed.iter().any(|a| a.covers(f)))
            .cloned()
            .collect(),
        stale: allowed
            .iter()
            .filter(|a| !findings.iter().any(|f| a.covers(f)))
            .collect(),
    }
}

// ---- Tests ---------------------------------------------------------------------------------

#[test]
fn every_kernel_takes_the_wave_size_from_warp_size() {
    let files = rocm_kernels::source::bundled_files();
    let result = audit(&files, ALLOWED);
    let mut problems = Vec::new();
    for f in &result.unlisted {
        problems.push(format!(
            "{f}\n    (if the literal is right, add an entry to ALLOWED in this file with the \
             reason)"
        ));
    }
    for a in &result.stale {
        problems.push(format!(
            "ALLOWED entry for {} `{}` matches no finding any more: remove it (it was: {})",
            a.file, a.code, a.reason
        ));
    }
    assert!(
        problems.is_empty(),
        "wave-size audit: {} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_audit_reads_every_file_under_kernels() {
    // The audit reads the crate's own list; a file the programs are made of but the list
    // misses would escape it.
    let listed: BTreeSet<&str> = rocm_kernels::source::bundled_files()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut on_disk = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the kernels folder") {
        let name = entry.expect("a folder entry").file_name();
        let name = name.to_string_lossy().into_owned();
        if name.ends_with(".hip") || name.ends_with(".h") {
            on_disk.push(name);
        }
    }
    assert!(!on_disk.is_empty());
    for name in &on_disk {
        assert!(
            listed.contains(name.as_str()),
            "kernels/{name} is not in rocm_kernels::source::bundled_files(): add it to the \
             module table (source.rs) so the programs and the audit include it"
        );
    }
}

/// The rules of every finding in `source` (as one file).
fn rules(source: &str) -> Vec<Rule> {
    scan("planted.hip", source)
        .into_iter()
        .map(|f| f.rule)
        .collect()
}

#[test]
fn planted_fixed_widths_are_reported() {
    let cases: [(&str, &[Rule]); 14] = [
        (
            "v += __shfl_xor_sync(0xffffffffu, v, 1, 32);",
            &[Rule::ShuffleLiteral, Rule::LaneMask32],
        ),
        ("v += __shfl_xor(v, m, 64);", &[Rule::ShuffleLiteral]),
        ("float w = warp_shfl(v, 31);", &[Rule::ShuffleLiteral]),
        (
            "const int lane = threadIdx.x % 32;",
            &[Rule::LaneArithmetic],
        ),
        ("const u32 lane = tid & 31;", &[Rule::LaneArithmetic]),
        (
            "const u32 warp = (threadIdx.x + k) / 32;",
            &[Rule::LaneArithmetic],
        ),
        ("if (lane < 64) x = 0;", &[Rule::LaneArithmetic]),
        (
            "const u32 n_warps = blockDim.x / 32;",
            &[Rule::LaneArithmetic],
        ),
        ("u32 active = __ballot(x > 0);", &[Rule::BallotIn32Bits]),
        ("const u64 m = (u32)__ballot(p);", &[Rule::BallotIn32Bits]),
        (
            "if (__activemask() == 0xffffffff) go();",
            &[Rule::LaneMask32],
        ),
        (
            "__shared__ float partial[32];",
            &[Rule::ArraySizedByLiteral],
        ),
        (
            "for (int m = 16; m > 0; m >>= 1) v += warp_shfl_xor(v, m);",
            &[Rule::ButterflyFromLiteral],
        ),
        ("const int n = warpSize;", &[Rule::RuntimeWarpSize]),
    ];
    for (source, want) in cases {
        let mut got = rules(source);
        got.sort();
        let mut want = want.to_vec();
        want.sort();
        assert_eq!(got, want, "{source}");
    }
    // The loop's shuffle may be on the next lines.
    assert_eq!(
        rules("for (int off = 32; off > 0; off >>= 1) {\n    v += __shfl_down(v, off);\n}"),
        [Rule::ButterflyFromLiteral]
    );
}

#[test]
fn wave_size_forms_and_other_uses_of_32_are_not_reported() {
    for source in [
        "const int lane = threadIdx.x % WARP_SIZE;",
        "const int warp = threadIdx.x / WARP_SIZE;",
        "v += __shfl_xor(v, m, WARP_SIZE);",
        "for (int m = WARP_SIZE / 2; m > 0; m >>= 1) v += warp_shfl_xor(v, m);",
        // Quantization groups of 32 values, block layouts, key arithmetic, bit splits.
        "if (i % 32 == 0) xd[i / 32] = d;",
        "const int q = b[16 + (i >> 6) * 32 + (i & 31)];",
        "return ((u64)float_order_key(v) << 32) | (u64)(0xffffffffu - i);",
        "const u32 hi = (u32)warp_shfl_xor_int((int)(u32)(v >> 32), lane_mask);",
        "xd + (u64)p * (cols / 32), cols, 1, lane,",
        // A sub-warp group of 16 lanes fits either wave.
        "for (int m = 8; m > 0; m >>= 1) s += warp_shfl_xor(s, m);",
        "const u32 r = mma_lane() % 16;",
        "#if WARP_SIZE != 32 && WARP_SIZE != 64",
        "u64 active = __ballot(x > 0);",
        "float v[8];",
        // Comments and strings are not code.
        "// lane = threadIdx.x % 32;",
        "/* __shared__ float s[32]; */ int x = 0;",
        "asm(\"mov %0, 32; lane % 32\" : \"=r\"(x));",
    ] {
        assert_eq!(rules(source), [], "{source}");
    }
}

#[test]
fn unlisted_findings_and_stale_entries_fail_the_audit() {
    let files = [(
        "k.hip",
        "__shared__ float s[32];\nconst int lane = threadIdx.x & 31;\n",
    )];
    let allowed = [
        Allowed {
            file: "k.hip",
            code: "__shared__ float s[32];",
            reason: "per-warp scratch",
        },
        Allowed {
            file: "k.hip",
            code: "red[g * 32 + warp]",
            reason: "no longer in the file",
        },
    ];
    let result = audit(&files, &allowed);
    assert_eq!(result.unlisted.len(), 1, "{result:?}");
    assert_eq!(result.unlisted[0].line, 2);
    assert_eq!(result.unlisted[0].rule, Rule::LaneArithmetic);
    assert_eq!(result.stale.len(), 1, "{result:?}");
    assert_eq!(result.stale[0].code, "red[g * 32 + warp]");
    // An entry of another file does not cover the finding.
    let elsewhere = [Allowed {
        file: "other.hip",
        code: "const int lane",
        reason: "",
    }];
    assert_eq!(audit(&files, &elsewhere).unlisted.len(), 2);
}

#[test]
fn comments_are_blanked_line_for_line() {
    let lines = code_lines("a /* x\ny */ b // z\n\"s // t\" c");
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0].trim(), "a");
    assert_eq!(lines[1].trim(), "b");
    assert!(
        lines[2].contains('c') && !lines[2].contains('t'),
        "{lines:?}"
    );
}
