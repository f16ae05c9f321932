//! PromQL and Prometheus's text formats read as tests/dashboards.rs checks
//! them: a tokenizer that tells the metric names of an expression from its
//! functions, keywords, labels and Grafana variables, with its selectors'
//! matchers and its aggregations' groupings; Grafana's variable queries
//! around PromQL; the series and label names of an exposition; and a
//! Prometheus regex as Prometheus anchors it.

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    /// A number or a duration.
    Number,
    /// A string literal, its text (a Grafana variable inside it stays as written).
    Str(String),
    /// A Grafana variable (`$x`, `${x}`, `[[x]]`).
    Var,
    Open(char),
    Close(char),
    /// An operator or a comma, one character each.
    Punct(char),
}

fn tokenize(expr: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            // A comment runs to the end of the line.
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if matches!(c, '"' | '\'' | '`') {
            i += 1;
            let mut text = String::new();
            loop {
                match chars.get(i) {
                    None => return Err(format!("unterminated string in `{expr}`")),
                    Some('\\') if c != '`' => {
                        // An escaped character stands for itself (enough
                        // for the regexes and names of these queries).
                        text.extend(chars.get(i + 1));
                        i += 2;
                    }
                    Some(&q) if q == c => break,
                    Some(&other) => {
                        text.push(other);
                        i += 1;
                    }
                }
            }
            i += 1;
            tokens.push(Token::Str(text));
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
            }
            tokens.push(Token::Var);
        } else if c == '[' && chars.get(i + 1) == Some(&'[') {
            // Grafana's old variable syntax, `[[name]]`.
            let close = (i + 2..chars.len().saturating_sub(1))
                .find(|&j| chars[j] == ']' && chars[j + 1] == ']')
                .ok_or_else(|| format!("unterminated [[variable]] in `{expr}`"))?;
            i = close + 2;
            tokens.push(Token::Var);
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // Numbers, durations (5m, 1h30m), exponents (1e3, 2e-3), hex.
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric()
                    || chars[i] == '.'
                    || chars[i] == '_'
                    || (matches!(chars[i], '+' | '-') && matches!(chars[i - 1], 'e' | 'E')))
            {
                i += 1;
            }
            tokens.push(Token::Number);
        } else if ident_start(c) {
            let begin = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            tokens.push(Token::Ident(chars[begin..i].iter().collect()));
        } else if matches!(c, '(' | '{' | '[') {
            tokens.push(Token::Open(c));
            i += 1;
        } else if matches!(c, ')' | '}' | ']') {
            tokens.push(Token::Close(c));
            i += 1;
        } else if "+-*/%^=!<>,@~|".contains(c) {
            tokens.push(Token::Punct(c));
            i += 1;
        } else {
            return Err(format!("unexpected `{c}` in `{expr}`"));
        }
    }
    Ok(tokens)
}

/// Keywords that are never metric names.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
    "Inf",
    "NaN",
    "group_left",
    "group_right",
];
/// Keywords followed by a list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// PromQL's aggregations and functions.
const FUNCTIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "abs",
    "absent",
    "absent_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_avg",
    "histogram_count",
    "histogram_fraction",
    "histogram_quantile",
    "histogram_stddev",
    "histogram_stdvar",
    "histogram_sum",
    "holt_winters",
    "double_exponential_smoothing",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "ln",
    "log2",
    "log10",
    "minute",
    "month",
    "predict_linear",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sort_by_label",
    "sort_by_label_desc",
    "sqrt",
    "time",
    "timestamp",
    "vector",
    "year",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "quantile_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "last_over_time",
    "present_over_time",
    "mad_over_time",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "cos",
    "cosh",
    "sin",
    "sinh",
    "tan",
    "tanh",
    "deg",
    "pi",
    "rad",
    "start",
    "end",
];

/// PromQL's aggregations: those that take `by` or `without`.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// A PromQL expression taken apart: its tokens, which of them are metric
/// names, and where each bracket closes.
pub(crate) struct Walked {
    tokens: Vec<Token>,
    /// `metric[i]`: token `i` is a metric name.
    metric: Vec<bool>,
    /// `closes[i]`: for an opening bracket at `i`, where it closes.
    closes: Vec<Option<usize>>,
}

/// How a label matcher compares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum MatchOp {
    Equal,
    NotEqual,
    Regex,
    NotRegex,
}

/// One label matcher of a selector: `label op "value"`; `value` is `None`
/// for a Grafana variable.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Matcher {
    pub label: String,
    pub op: MatchOp,
    pub value: Option<String>,
}

/// A `by (...)` or `without (...)` of an aggregation, and the metrics whose
/// labels it groups: those of its argument, but the right-hand operands of
/// `and` and `unless`, which give it no labels.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Grouping {
    pub labels: Vec<String>,
    pub metrics: BTreeSet<String>,
}

impl Walked {
    pub(crate) fn names(&self) -> BTreeSet<String> {
        self.metric_indices().map(|i| self.ident(i)).collect()
    }

    fn metric_indices(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.tokens.len()).filter(|&i| self.metric[i])
    }

    fn ident(&self, i: usize) -> String {
        match &self.tokens[i] {
            Token::Ident(word) => word.clone(),
            other => unreachable!("token {i} is {other:?}, not a name"),
        }
    }

    fn is_ident(&self, i: usize, words: &[&str]) -> bool {
        matches!(self.tokens.get(i), Some(Token::Ident(w)) if words.contains(&w.as_str()))
    }

    /// The names of a label list whose `(` is at `open`.
    fn label_list(&self, open: usize) -> Vec<String> {
        let close = self.closes[open].expect("a closed list");
        self.tokens[open + 1..close]
            .iter()
            .filter_map(|token| match token {
                Token::Ident(label) => Some(label.clone()),
                _ => None,
            })
            .collect()
    }

    /// Every metric with a `{...}` and its matchers.
    pub(crate) fn selectors(&self) -> Result<Vec<(String, Vec<Matcher>)>, String> {
        let mut found = Vec::new();
        for i in self.metric_indices() {
            if self.tokens.get(i + 1) != Some(&Token::Open('{')) {
                continue;
            }
            let close = self.closes[i + 1].expect("a closed selector");
            let mut matchers = Vec::new();
            let inside = &self.tokens[i + 2..close];
            for part in inside.split(|t| *t == Token::Punct(',')) {
                let (label, op, value) = match part {
                    [] => continue,
                    [Token::Ident(label), Token::Punct('='), value] => {
                        (label, MatchOp::Equal, value)
                    }
                    [
                        Token::Ident(label),
                        Token::Punct('!'),
                        Token::Punct('='),
                        value,
                    ] => (label, MatchOp::NotEqual, value),
                    [
                        Token::Ident(label),
                        Token::Punct('='),
                        Token::Punct('~'),
                        value,
                    ] => (label, MatchOp::Regex, value),
                    [
                        Token::Ident(label),
                        Token::Punct('!'),
                        Token::Punct('~'),
                        value,
                    ] => (label, MatchOp::NotRegex, value),
                    other => return Err(format!("a matcher of `{}` is {other:?}", self.ident(i))),
                };
                let value = match value {
                    Token::Str(text) if !text.contains('$') => Some(text.clone()),
                    Token::Str(_) | Token::Var => None,
                    other => return Err(format!("a matcher's value is {other:?}")),
                };
                matchers.push(Matcher {
                    label: label.clone(),
                    op,
                    value,
                });
            }
            found.push((self.ident(i), matchers));
        }
        Ok(found)
    }

    /// Every `by (...)` and `without (...)` of an aggregation, in either
    /// place: `sum by (x) (...)` or `sum (...) by (x)`.
    pub(crate) fn groupings(&self) -> Vec<Grouping> {
        let mut found = Vec::new();
        for (i, token) in self.tokens.iter().enumerate() {
            let Token::Ident(word) = token else { continue };
            if !AGGREGATIONS.contains(&word.as_str()) {
                continue;
            }
            let grouping = ["by", "without"];
            let (labels, body) = if self.is_ident(i + 1, &grouping) {
                // sum by (x) (body)
                let Some(list_end) = self.closes.get(i + 2).copied().flatten() else {
                    continue;
                };
                (self.label_list(i + 2), list_end + 1)
            } else if self.tokens.get(i + 1) == Some(&Token::Open('(')) {
                // sum (body) by (x)
                let Some(end) = self.closes[i + 1] else {
                    continue;
                };
                if !self.is_ident(end + 1, &grouping)
                    || self.tokens.get(end + 2) != Some(&Token::Open('('))
                {
                    continue;
                }
                (self.label_list(end + 2), i + 1)
            } else {
                continue;
            };
            let Some(Some(body_end)) = self.closes.get(body) else {
                continue;
            };
            found.push(Grouping {
                labels,
                metrics: self.operands_with_labels(body + 1, *body_end),
            });
        }
        found
    }

    /// The metrics between `from` and `to` whose labels the result keeps:
    /// all but the right-hand operands of `and` and `unless` (which bind
    /// tighter than `or`), at any depth.
    fn operands_with_labels(&self, from: usize, to: usize) -> BTreeSet<String> {
        let mut metrics = BTreeSet::new();
        // One flag per open bracket: past an `and` or `unless` at its level.
        let mut right_of_and = vec![false];
        for (i, token) in self.tokens.iter().enumerate().take(to).skip(from) {
            match token {
                Token::Open(_) => right_of_and.push(false),
                Token::Close(_) => {
                    right_of_and.pop();
                }
                Token::Ident(word) if word == "and" || word == "unless" => {
                    *right_of_and.last_mut().expect("a level") = true;
                }
                Token::Ident(word) if word == "or" => {
                    *right_of_and.last_mut().expect("a level") = false;
                }
                _ if self.metric[i] && !right_of_and.contains(&true) => {
                    metrics.insert(self.ident(i));
                }
                _ => {}
            }
        }
        metrics
    }
}

/// Takes a PromQL expression apart (see [`Walked`]); label names,
/// functions, keywords, strings, numbers, durations and Grafana variables
/// are not metric names.
pub(crate) fn walk(expr: &str) -> Result<Walked, String> {
    if expr.contains("__name__") {
        return Err(format!(
            "`{expr}` selects by __name__; name the metric instead"
        ));
    }
    let tokens = tokenize(expr)?;
    let mut metric = vec![false; tokens.len()];
    let mut closes = vec![None; tokens.len()];
    // Open brackets, where they open and whether they hide what is inside:
    // a label matcher `{`, a range `[` or a label list `(` does.
    let mut stack: Vec<(char, usize, bool)> = Vec::new();
    let hidden = |stack: &[(char, usize, bool)]| stack.iter().any(|&(_, _, hides)| hides);
    let mut after_label_keyword = false;
    for (i, token) in tokens.iter().enumerate() {
        let next_opens_paren = matches!(tokens.get(i + 1), Some(Token::Open('(')));
        // An aggregation may name its grouping first: `sum by (x) (...)`.
        let next_groups = matches!(
            tokens.get(i + 1),
            Some(Token::Ident(w)) if w == "by" || w == "without"
        );
        match token {
            Token::Open(c) => {
                let hides = *c != '(' || after_label_keyword;
                stack.push((*c, i, hides));
                after_label_keyword = false;
                continue;
            }
            Token::Close(c) => {
                let want = match c {
                    ')' => '(',
                    '}' => '{',
                    _ => '[',
                };
                match stack.pop() {
                    Some((open, at, _)) if open == want => closes[at] = Some(i),
                    _ => return Err(format!("unbalanced `{c}` in `{expr}`")),
                }
            }
            Token::Ident(word) if !hidden(&stack) => {
                if LABEL_LISTS.contains(&word.as_str()) && next_opens_paren {
                    after_label_keyword = true;
                    continue;
                }
                if next_opens_paren || next_groups {
                    if !FUNCTIONS.contains(&word.as_str()) {
                        return Err(format!("`{word}(` in `{expr}` is no PromQL function"));
                    }
                } else if !KEYWORDS.contains(&word.as_str()) {
                    metric[i] = true;
                }
            }
            _ => {}
        }
        after_label_keyword = false;
    }
    if let Some((open, _, _)) = stack.last() {
        return Err(format!("unclosed `{open}` in `{expr}`"));
    }
    Ok(Walked {
        tokens,
        metric,
        closes,
    })
}

/// The metric names of a PromQL expression; label names, functions,
/// keywords, strings, numbers, durations and Grafana variables are not.
pub(crate) fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    walk(expr).map(|walked| walked.names())
}

/// The PromQL of a Grafana template variable query for Prometheus, and the
/// label it lists: `label_values(selector, label)`, `label_values(label)`
/// (no PromQL), `query_result(expr)`, or a plain expression.
pub(crate) fn variable_query_parts(query: &str) -> Result<(Option<&str>, Option<&str>), String> {
    let query = query.trim();
    let inner = |prefix: &str| {
        query
            .strip_prefix(prefix)
            .and_then(|rest| rest.trim_start().strip_prefix('('))
            .and_then(|rest| rest.trim_end().strip_suffix(')'))
    };
    if let Some(args) = inner("label_values") {
        return match args.rsplit_once(',') {
            Some((selector, label)) => {
                let label = label.trim();
                if label.is_empty() || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    return Err(format!("`{query}`: `{label}` is no label name"));
                }
                Ok((Some(selector), Some(label)))
            }
            None => Ok((None, Some(args.trim()))),
        };
    }
    if let Some(expr) = inner("query_result") {
        return Ok((Some(expr), None));
    }
    if query.starts_with("metrics(") || query.starts_with("label_names(") {
        return Err(format!("`{query}` does not name its metrics"));
    }
    Ok((Some(query), None))
}

/// The metric names of a Grafana template variable query (see
/// [`variable_query_parts`]).
pub(crate) fn variable_metric_names(query: &str) -> Result<BTreeSet<String>, String> {
    match variable_query_parts(query)? {
        (Some(expr), _) => metric_names(expr),
        (None, _) => Ok(BTreeSet::new()),
    }
}

// -------------------------------------------------------------- expositions

/// The series names of a Prometheus or OpenMetrics text exposition: those
/// of its samples, and those each `# TYPE` line's family gives (a family
/// with no sample yet shows only its TYPE line).
pub(crate) fn exposition_names(text: &str, openmetrics: bool) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(family), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match (openmetrics, kind) {
                // OpenMetrics names a counter's family without `_total`.
                (true, "counter") => &["_total"],
                (true, "info") => &["_info"],
                (true, "gaugehistogram") => &["_bucket", "_gsum", "_gcount"],
                (_, "histogram") => &["_bucket", "_sum", "_count"],
                (_, "summary") => &["", "_sum", "_count"],
                _ => &[""],
            };
            for suffix in suffixes {
                names.insert(format!("{family}{suffix}"));
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// The label names each series of an exposition shows, by series name
/// (`le` of a histogram's `_bucket` included).
pub(crate) fn exposition_labels(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let names = labels.entry(line[..end].to_owned()).or_default();
        let Some(mut rest) = line[end..].strip_prefix('{') else {
            continue;
        };
        // name="value" pairs, values with backslash escapes, up to `}`.
        while let Some((name, after)) = rest.split_once("=\"") {
            names.insert(name.trim_start_matches(',').trim().to_owned());
            let mut chars = after.char_indices();
            let mut close = after.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => {
                        close = i;
                        break;
                    }
                    _ => {}
                }
            }
            rest = &after[(close + 1).min(after.len())..];
            if rest.starts_with('}') {
                break;
            }
        }
    }
    labels
}

// ------------------------------------------------------------------ regexes

/// A Prometheus regex as Prometheus reads it: anchored at both ends.
pub(crate) fn prometheus_regex(pattern: &str) -> Regex {
    Regex::new(&format!("^(?:{pattern})$"))
        .unwrap_or_else(|e| panic!("`{pattern}` is no regex: {e}"))
}
