//! Stop strings: generation ends where its text contains one of them, matched across token
//! boundaries, and the text from the stop string on is never shown. Text that could still be
//! the start of a stop string is held back until the next piece tells.

/// Matches stop strings in text that arrives in pieces.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not yet released: it could be the start of a stop string.
    pending: String,
    stopped: bool,
}

impl StopStrings {
    /// Empty strings are dropped (they would match everywhere).
    pub fn new(stops: impl IntoIterator<Item = String>) -> StopStrings {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..StopStrings::default()
        }
    }

    /// Whether a stop string has been seen.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Takes the next piece of text; returns the text that can be shown now (everything up to
    /// a stop string once one is found, and nothing after it).
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.pending.push_str(piece);
        let found = (self.stops.iter())
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = found {
            self.stopped = true;
            let shown = self.pending[..at].to_string();
            self.pending.clear();
            return shown;
        }
        // Hold back the longest end of the pending text that begins some stop string.
        let held = (self.stops.iter())
            .map(|s| longest_suffix_prefix(&self.pending, s))
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - held;
        let shown = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        shown
    }

    /// The text still held back, once generation has ended without a stop string.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.pending)
    }
}

/// Bytes of the longest end of `text` that is a start of `stop` (on character boundaries).
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let most = text.len().min(stop.len().saturating_sub(1));
    (1..=most)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopStrings::new(stops.iter().map(|s| s.to_string()));
        let mut out: String = pieces.iter().map(|p| m.push(p)).collect();
        out.push_str(&m.finish());
        (out, m.stopped())
    }

    #[test]
    fn a_stop_string_across_pieces_ends_the_text_before_it() {
        assert_eq!(
            run(&["END"], &["abc E", "N", "Dxyz"]),
            ("abc ".into(), true)
        );
        // The earliest of several wins; later text is dropped.
        assert_eq!(run(&["yz", "c E"], &["abc E", "Nyz"]), ("ab".into(), true));
    }

    #[test]
    fn a_false_start_is_released_and_nothing_is_lost() {
        let mut m = StopStrings::new(["<stop>".to_string()]);
        assert_eq!(m.push("x <st"), "x ");
        assert_eq!(m.push("ill here"), "<still here");
        assert_eq!(m.push(" <"), " ");
        assert_eq!(m.finish(), "<");
        assert!(!m.stopped());
        // No stop strings, or only empty ones: text passes as it comes.
        assert_eq!(run(&[""], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        assert_eq!(run(&["été!"], &["un é", "té", "!"]), ("un ".into(), true));
        assert_eq!(run(&["ét"], &["aé", "x"]), ("aéx".into(), false));
    }
}
