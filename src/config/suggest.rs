//! "Did you mean" suggestions by edit distance.

/// The candidate closest to `typed`, if close enough to be a plausible typo: at most one edit
/// per three characters (minimum one). Ties go to the earlier candidate.
pub(crate) fn did_you_mean<'a>(
    typed: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let mut best: Option<(usize, &'a str)> = None;
    for candidate in candidates {
        let distance = edit_distance(typed, candidate);
        let limit = (candidate.chars().count() / 3).max(1);
        if distance <= limit && best.is_none_or(|(d, _)| distance < d) {
            best = Some((distance, candidate));
        }
    }
    best.map(|(_, name)| name)
}

/// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
/// adjacent characters each cost 1 (so "rnr_retyr" is one edit from "rnr_retry").
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // rows[i][j] = distance between a[..i] and b[..j]; three rows are enough for swaps.
    let mut before_prev: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (prev[j] + 1).min(row[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(before_prev[j - 2] + 1);
            }
            row[j] = d;
        }
        before_prev = std::mem::replace(&mut prev, row);
    }
    prev[b.len()]
}
