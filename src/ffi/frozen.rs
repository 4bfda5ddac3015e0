//! The field order of the C structs that grow (those starting with `size_t struct_size`,
//! see `sized.rs`) is frozen: a caller built against an older header reads a prefix of the
//! new struct, so a field may only be added at the end. This test reads `include/rdmx.h`
//! (cbindgen's output, committed) and checks each such struct against the order recorded in
//! `frozen_fields.txt`: the recorded fields must come first, in that order. A field added at
//! the end passes (record it there too, so that it is frozen as well); one inserted,
//! removed, renamed or moved fails, and so does a new growing struct not recorded.

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    /// The header with its comments removed.
    fn strip_comments(s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(i) = rest.find("/*") {
            out.push_str(&rest[..i]);
            match rest[i..].find("*/") {
                Some(j) => rest = &rest[i + j + 2..],
                None => return out,
            }
        }
        out.push_str(rest);
        out.lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every `typedef struct { ... } name;` of `header`: its name and field names in order.
    fn structs(header: &str) -> BTreeMap<String, Vec<String>> {
        let text = strip_comments(header);
        let mut found = BTreeMap::new();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("typedef struct {") {
            let body_start = i + "typedef struct {".len();
            let mut depth = 1;
            let mut end = None;
            for (k, c) in rest[body_start..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(body_start + k);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let end = end.expect("unbalanced braces in include/rdmx.h");
            let body = &rest[body_start..end];
            let after = &rest[end + 1..];
            let name = after[..after.find(';').unwrap()].trim().to_string();
            let fields = body
                .split(';')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(|d| {
                    let d = d.split('[').next().unwrap().trim_end();
                    let start = d
                        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .map_or(0, |p| p + 1);
                    d[start..].to_string()
                })
                .collect();
            found.insert(name, fields);
            rest = &after[after.find(';').unwrap()..];
        }
        found
    }

    fn frozen() -> BTreeMap<String, Vec<String>> {
        include_str!("frozen_fields.txt")
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (name, fields) = l.split_once(':').expect("name: fields");
                let fields = fields.split_whitespace().map(String::from).collect();
                (name.trim().to_string(), fields)
            })
            .collect()
    }

    fn header() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/rdmx.h");
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Where `now` breaks the frozen order `was` (None: `was` is a prefix of `now`).
    fn broken(was: &[String], now: &[String]) -> Option<String> {
        for (k, f) in was.iter().enumerate() {
            match now.get(k) {
                Some(g) if g == f => {}
                Some(g) => return Some(format!("field {k} is `{g}`, was `{f}`")),
                None => return Some(format!("field {k} `{f}` is gone")),
            }
        }
        None
    }

    #[test]
    fn growing_c_structs_only_grow_at_their_end() {
        let now = structs(&header());
        let was = frozen();
        let mut bad = Vec::new();
        for (name, fields) in &now {
            if fields.first().map(String::as_str) != Some("struct_size") {
                continue;
            }
            match was.get(name) {
                None => bad.push(format!(
                    "{name}: starts with struct_size but is not recorded in src/ffi/frozen_fields.txt (add: `{name}: {}`)",
                    fields.join(" ")
                )),
                Some(w) => bad.extend(broken(w, fields).map(|why| {
                    format!("{name}: {why}: fields may only be added at the end (include/rdmx.h, \"Structs that grow\")")
                })),
            }
        }
        for name in was.keys() {
            if !now.contains_key(name) {
                bad.push(format!("{name}: recorded but no longer in include/rdmx.h"));
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        assert!(was.len() >= 10, "the record lists {} structs", was.len());
    }

    /// The parser and the rule on a literal header: the check can fail.
    #[test]
    fn a_field_inserted_in_the_middle_is_found() {
        let h = "typedef struct {\n  /** size */\n  size_t struct_size;\n  uint64_t a;\n  /* why */ uint64_t b[4];\n  const char *c;\n} s_t;\n";
        let s = structs(h);
        let f = &s["s_t"];
        assert_eq!(f, &["struct_size", "a", "b", "c"]);
        let was: Vec<String> = ["struct_size", "a", "c"].map(String::from).to_vec();
        assert_eq!(broken(&was, f).unwrap(), "field 2 is `b`, was `c`");
        let grown: Vec<String> = ["struct_size", "a", "c", "d"].map(String::from).to_vec();
        assert_eq!(broken(&was, &grown), None);
    }
}
