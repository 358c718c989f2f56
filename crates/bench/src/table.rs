//! Markdown tables padded to their widest cell, as llama-bench prints them, and CSV rows.

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A column header and its alignment.
#[derive(Clone, Debug)]
pub struct Column {
    pub header: String,
    pub align: Align,
}

impl Column {
    pub fn left(header: impl Into<String>) -> Column {
        Column {
            header: header.into(),
            align: Align::Left,
        }
    }

    pub fn right(header: impl Into<String>) -> Column {
        Column {
            header: header.into(),
            align: Align::Right,
        }
    }
}

/// Renders a Markdown table; every row must have one cell per column. Widths count chars, so
/// `±` and `–` take one column like in a terminal.
pub fn markdown(columns: &[Column], rows: &[Vec<String>]) -> String {
    let width = |s: &str| s.chars().count();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|s| width(s))
                .chain([width(&c.header), 3])
                .max()
                .unwrap_or(3)
        })
        .collect();
    let pad = |s: &str, w: usize, align: Align| {
        let fill = " ".repeat(w.saturating_sub(width(s)));
        match align {
            Align::Left => format!("{s}{fill}"),
            Align::Right => format!("{fill}{s}"),
        }
    };
    let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    let mut out = line(
        columns
            .iter()
            .zip(&widths)
            .map(|(c, &w)| pad(&c.header, w, c.align))
            .collect(),
    );
    out.push_str(&line(
        columns
            .iter()
            .zip(&widths)
            .map(|(c, &w)| match c.align {
                Align::Left => "-".repeat(w),
                Align::Right => format!("{}:", "-".repeat(w - 1)),
            })
            .collect(),
    ));
    for row in rows {
        out.push_str(&line(
            columns
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, &w))| pad(row.get(i).map_or("", |s| s), w, c.align))
                .collect(),
        ));
    }
    out
}

/// One CSV field, quoted when it holds a comma, a quote or a line break (RFC 4180).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One CSV line of fields.
pub fn csv_line<S: AsRef<str>>(fields: &[S]) -> String {
    let mut line = fields
        .iter()
        .map(|f| csv_field(f.as_ref()))
        .collect::<Vec<_>>()
        .join(",");
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_pads_and_aligns() {
        let t = markdown(
            &[Column::left("model"), Column::right("t/s")],
            &[
                vec!["tiny.gguf".into(), "12.30 ± 0.40".into()],
                vec!["a".into(), "1.00 ± 0.00".into()],
            ],
        );
        let expected = "\
| model     |          t/s |
| --------- | -----------: |
| tiny.gguf | 12.30 ± 0.40 |
| a         |  1.00 ± 0.00 |
";
        assert_eq!(t, expected);
    }

    #[test]
    fn markdown_has_a_minimum_width_and_fills_missing_cells() {
        let t = markdown(
            &[Column::left("x"), Column::right("y")],
            &[vec!["1".into()]],
        );
        assert_eq!(t, "| x   |   y |\n| --- | --: |\n| 1   |     |\n");
    }

    #[test]
    fn csv_quotes_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_line(&["a", "b,c", ""]), "a,\"b,c\",\n");
    }
}
