//! The template memory budget: how many bytes one render may hold, and the
//! checks that enforce it while minijinja runs.
//!
//! Why: fuel bounds instructions, not bytes, and one instruction can double
//! a string (`{% set x = x ~ x %}`): thirty of them took the master to
//! 2.7 GB before the 1 MiB output cap was ever looked at (issue 22, item 3).
//!
//! How, in three parts:
//! - every render runs inside [`crate::alloc_meter::measure`], so
//!   [`crate::alloc_meter::live`] is the bytes this render holds;
//! - *post-checks*: after every instruction that can grow memory, and once
//!   per loop iteration, the rewritten program (`rewrite.rs`) calls
//!   [`POST`], which fails once live bytes pass [`TEMPLATE_MEMORY_BUDGET`];
//! - *pre-checks*: where ONE instruction or filter could grow memory
//!   without bound (showing a list that holds a million references to one
//!   big string, `'x' * n`, `replace`, `indent`, ...), its output is
//!   estimated first, from its inputs and without allocating, and refused
//!   if it would not fit in what is left of the budget.
//!
//! So between two checks memory grows by at most a small multiple of what
//! is left of the budget, and a render peaks within a small multiple of
//! it (the tests measure under 64 MiB for every hostile shape known).
//!
//! Sequences are the other lever: `l + l` and `l | chain(l)` build lazy
//! sequences whose length doubles in constant memory, and which a single
//! `|list` would then materialise. Every way to make a long lazy sequence
//! is capped at [`MAX_ITEMS`] items, so materialising any sequence costs at
//! most a budget's worth of values.
//!
//! A failed check sets a sticky flag for the rest of the render: a filter
//! that swallows an error (`int(default=..)`) cannot turn a refusal into
//! output, and the renderer reports the budget whatever error surfaced.

use std::cell::Cell;
use std::fmt::{self, Write};

use minijinja::value::{Rest, Value, ValueKind, ValueOrKwargs};
use minijinja::{AutoEscape, Error, ErrorKind, State};

use crate::alloc_meter;

/// The most bytes one render may hold: 16 times the largest rendered file
/// (`MAX_RENDERED_BYTES`, 1 MiB), room for a file near the cap to be built
/// with temporaries, far from what hurts a master.
pub const TEMPLATE_MEMORY_BUDGET: usize = 16 * 1024 * 1024;

/// The size of one template value: what each item of a materialised
/// sequence costs.
pub const VALUE_SIZE: usize = std::mem::size_of::<Value>();

/// The longest sequence a template may make, lazy or not: a budget's worth
/// of values.
pub const MAX_ITEMS: usize = TEMPLATE_MEMORY_BUDGET / VALUE_SIZE;

/// HTML escaping (`|e`, `{% autoescape true %}`) turns one byte into at most
/// six (`&quot;`).
const ESCAPE_FACTOR: usize = 6;

/// Case mapping turns one byte into at most three (`ΐ` → `Ϊ́`).
const CASE_FACTOR: usize = 3;

/// The one sentence every refusal carries, so an operator sees the budget.
pub fn budget_message() -> String {
    format!("rendering used more than {} MiB (the template memory budget)", TEMPLATE_MEMORY_BUDGET / (1024 * 1024))
}

thread_local! {
    /// Set by the first failed check of a render; see the module doc.
    static EXCEEDED: Cell<bool> = const { Cell::new(false) };
}

/// Clears the sticky flag; called when a render starts.
pub(super) fn reset() {
    EXCEEDED.set(false);
}

/// Whether a check of the current render failed.
pub(super) fn exceeded() -> bool {
    EXCEEDED.get()
}

fn refuse() -> Error {
    EXCEEDED.set(true);
    Error::new(ErrorKind::InvalidOperation, budget_message())
}

/// Bytes left before the budget, 0 when it is spent.
fn remaining() -> usize {
    let live = alloc_meter::live();
    if EXCEEDED.get() {
        return 0;
    }
    (TEMPLATE_MEMORY_BUDGET as isize).saturating_sub(live).max(0) as usize
}

/// Fails when the render holds more than the budget (or failed before).
pub fn check_live() -> Result<(), Error> {
    if EXCEEDED.get() || alloc_meter::live() > TEMPLATE_MEMORY_BUDGET as isize {
        return Err(refuse());
    }
    Ok(())
}

/// Fails unless `bytes` more fit in what is left of the budget.
pub fn check_more(bytes: usize) -> Result<(), Error> {
    if bytes > remaining() {
        return Err(refuse());
    }
    Ok(())
}

/// Counts what is written and stops (with an error) past `cap`.
struct Counter {
    n: usize,
    cap: usize,
}

impl Write for Counter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.n = self.n.saturating_add(s.len());
        if self.n > self.cap { Err(fmt::Error) } else { Ok(()) }
    }
}

/// The bytes `{{ v }}` writes, counted by writing it nowhere; stops early
/// and answers more than `cap` once it passes `cap`, so a value whose text
/// would be terabytes costs at most `cap` bytes of counting, no memory.
pub fn display_len(v: &Value, cap: usize) -> usize {
    match v.kind() {
        ValueKind::String => v.as_str().map_or(0, str::len),
        // Lossy UTF-8 turns one bad byte into three.
        ValueKind::Bytes => v.as_bytes().map_or(0, |b| b.len().saturating_mul(3)),
        ValueKind::Undefined | ValueKind::None | ValueKind::Bool => 5,
        _ => {
            let mut c = Counter { n: 0, cap };
            let _ = write!(c, "{v}");
            c.n
        }
    }
}

/// Like [`display_len`] for `{:#?}` (the `pprint` filter).
fn pretty_len(v: &Value, cap: usize) -> usize {
    let mut c = Counter { n: 0, cap };
    let _ = write!(c, "{v:#?}");
    c.n
}

/// How many items iterating `v` yields, more than `cap` once past it. A
/// string's bytes bound its characters; a sized value says its length; an
/// unsized iterable is counted without keeping its items.
pub fn items_len(v: &Value, cap: usize) -> usize {
    if v.kind() == ValueKind::String {
        return v.as_str().map_or(0, str::len);
    }
    if let Some(n) = v.len() {
        return n;
    }
    match v.try_iter() {
        Ok(iter) => iter.take(cap.saturating_add(1)).count(),
        Err(_) => 0,
    }
}

fn items_cap() -> usize {
    remaining() / VALUE_SIZE
}

/// Fails unless materialising `n` values fits.
fn check_items(n: usize) -> Result<(), Error> {
    check_more(n.saturating_mul(VALUE_SIZE))
}

/// Fails unless a lazy sequence of `n` items may exist (see [`MAX_ITEMS`]).
fn check_lazy(n: usize) -> Result<(), Error> {
    if n > MAX_ITEMS {
        return Err(refuse());
    }
    Ok(())
}

/// The display length of `v`, if it fits what is left.
fn fitting_display(v: &Value) -> Result<usize, Error> {
    let rem = remaining();
    let n = display_len(v, rem);
    if n > rem {
        return Err(refuse());
    }
    Ok(n)
}

fn escaping(state: &State) -> bool {
    !matches!(state.auto_escape(), AutoEscape::None)
}

// ---------------------------------------------------------------------------
// The checks the rewritten instructions call, as filters (a filter name is
// looked up once per render and cached, and no template can define one).
// Names hold a `-`, so no template can write them as `|name` either.

/// After an instruction that grows memory, on the value it pushed.
pub const POST: &str = "flotilla-budget";
/// Before `Emit`: the text of the value on top.
pub const PRE_EMIT: &str = "flotilla-budget-emit";
/// Before `StringConcat` (`~`): both texts. Returns the pair reversed, for
/// an `UnpackList(2)` that puts them back.
pub const PRE_CONCAT: &str = "flotilla-budget-concat";
/// Before `Add`: strings, tuples and lazy sequences.
pub const PRE_ADD: &str = "flotilla-budget-add";
/// Before `Mul`: repeated strings and sequences.
pub const PRE_MUL: &str = "flotilla-budget-mul";
/// Before `In` and `in` comparisons: a needle shown as text to search a string.
pub const PRE_IN: &str = "flotilla-budget-in";
/// Before `UnpackList`: every item is pushed before the count is compared.
pub const PRE_UNPACK: &str = "flotilla-budget-unpack";
/// Before `UnpackLists` (`f(*a, *b)`): the items of all of them.
pub const PRE_SPREAD: &str = "flotilla-budget-spread";
/// Before `Slice`: a string's slice copies it, a tuple's materialises it.
pub const PRE_SLICE: &str = "flotilla-budget-slice";

fn post(v: ValueOrKwargs) -> Result<ValueOrKwargs, Error> {
    check_live()?;
    Ok(v)
}

fn pre_emit(state: &State, v: ValueOrKwargs) -> Result<ValueOrKwargs, Error> {
    check_live()?;
    let n = fitting_display(&v)?;
    if escaping(state) {
        check_more(n.saturating_mul(ESCAPE_FACTOR))?;
    }
    Ok(v)
}

/// The operands in the order `UnpackList` pushes back as they were.
fn restack(args: Vec<Value>) -> Value {
    Value::from(args.into_iter().rev().collect::<Vec<_>>())
}

fn pre_concat(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.0.into_iter().map(ValueOrKwargs::into_value).collect::<Vec<_>>();
    check_live()?;
    let total = args.iter().map(fitting_display).try_fold(0usize, |acc, n| n.map(|n| acc.saturating_add(n)))?;
    check_more(total)?;
    Ok(restack(args))
}

fn is_seq(v: &Value) -> bool {
    matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable)
}

fn pre_add(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.0.into_iter().map(ValueOrKwargs::into_value).collect::<Vec<_>>();
    check_live()?;
    if let [a, b] = &args[..] {
        if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
            check_more(x.len().saturating_add(y.len()))?;
        } else if a.is_tuple() || b.is_tuple() {
            check_items(items_len(a, items_cap()).saturating_add(items_len(b, items_cap())))?;
        } else if is_seq(a) && is_seq(b) {
            // Lazy, but materialised past 32 nested additions.
            let n = items_len(a, MAX_ITEMS).saturating_add(items_len(b, MAX_ITEMS));
            check_lazy(n)?;
        }
    }
    Ok(restack(args))
}

fn pre_mul(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.0.into_iter().map(ValueOrKwargs::into_value).collect::<Vec<_>>();
    check_live()?;
    if let [a, b] = &args[..] {
        // Either side may be the count, as in minijinja's `mul`.
        let (what, n) = if a.as_usize().is_some() && !b.is_number() { (b, a) } else { (a, b) };
        if let Some(n) = n.as_usize() {
            if let Some(s) = what.as_str() {
                check_more(s.len().saturating_mul(n))?;
            } else if what.is_tuple() {
                check_items(items_len(what, items_cap()).saturating_mul(n))?;
            } else if is_seq(what) {
                check_lazy(items_len(what, MAX_ITEMS).saturating_mul(n))?;
            }
        }
    }
    Ok(restack(args))
}

fn pre_in(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.0.into_iter().map(ValueOrKwargs::into_value).collect::<Vec<_>>();
    check_live()?;
    if let [needle, container] = &args[..] {
        // Searching a string shows the needle as text.
        if container.kind() == ValueKind::String && needle.kind() != ValueKind::String {
            fitting_display(needle)?;
        }
    }
    Ok(restack(args))
}

fn pre_unpack(v: ValueOrKwargs) -> Result<ValueOrKwargs, Error> {
    check_live()?;
    check_items(items_len(&v, items_cap()))?;
    Ok(v)
}

fn pre_spread(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.0.into_iter().map(ValueOrKwargs::into_value).collect::<Vec<_>>();
    check_live()?;
    let n = args.iter().fold(0usize, |acc, v| acc.saturating_add(items_len(v, items_cap())));
    check_items(n)?;
    Ok(restack(args))
}

fn pre_slice(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.0.into_iter().map(ValueOrKwargs::into_value).collect::<Vec<_>>();
    check_live()?;
    if let Some(v) = args.first() {
        if let Some(s) = v.as_str() {
            // A backwards slice collects the characters (4 bytes each) first.
            check_more(s.len().saturating_mul(5))?;
        } else if v.is_tuple() {
            check_items(items_len(v, items_cap()))?;
        }
    }
    Ok(restack(args))
}

/// Registers the checks the rewritten instructions call.
pub(super) fn add_checks(env: &mut minijinja::Environment<'static>) {
    env.add_filter(POST, post);
    env.add_filter(PRE_EMIT, pre_emit);
    env.add_filter(PRE_CONCAT, pre_concat);
    env.add_filter(PRE_ADD, pre_add);
    env.add_filter(PRE_MUL, pre_mul);
    env.add_filter(PRE_IN, pre_in);
    env.add_filter(PRE_UNPACK, pre_unpack);
    env.add_filter(PRE_SPREAD, pre_spread);
    env.add_filter(PRE_SLICE, pre_slice);
}

// ---------------------------------------------------------------------------
// Estimates for the built-in filters, tests and functions (`builtins.rs`
// calls these before the real one runs, and `check_live` after).

/// What `f` would add at most, from its arguments (`args[0]` is the value
/// filtered), checked against what is left; `Ok` when it fits.
pub(super) fn pre_filter(name: &str, state: &State, args: &[Value]) -> Result<(), Error> {
    check_live()?;
    let arg = |i: usize| args.get(i).filter(|v| !v.is_kwargs());
    let kwarg = |key: &str| -> Option<Value> {
        args.last().filter(|v| v.is_kwargs()).and_then(|kw| kw.get_attr(key).ok()).filter(|v| !v.is_undefined())
    };
    let v = match arg(0) {
        Some(v) => v,
        None => return Ok(()),
    };
    let esc = if escaping(state) { ESCAPE_FACTOR } else { 1 };
    match name {
        // Text in, text of about the same size out (times escaping).
        "safe" | "string" | "trim" => {
            check_more(fitting_display(v)?.saturating_mul(esc))?;
            // The characters to trim, collected as `char`s.
            if name == "trim"
                && let Some(chars) = arg(1).cloned().or(kwarg("chars"))
            {
                check_more(fitting_display(&chars)?.saturating_mul(4))?;
            }
        }
        "reverse" if v.kind() == ValueKind::String => check_more(fitting_display(v)?)?,
        "escape" | "e" => check_more(fitting_display(v)?.saturating_mul(ESCAPE_FACTOR))?,
        "lower" | "upper" | "title" | "capitalize" => {
            check_more(fitting_display(v)?.saturating_mul(CASE_FACTOR * esc))?
        }
        "replace" => {
            let s = fitting_display(v)?;
            let from = arg(1).map(fitting_display).transpose()?.unwrap_or(0);
            let to = arg(2).map(fitting_display).transpose()?.unwrap_or(0);
            // Exact count of matches when the text can grow; an empty
            // pattern matches between every two characters.
            let out = if to > from {
                let text = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
                let pat = arg(1).map(|p| p.as_str().map(str::to_owned).unwrap_or_else(|| p.to_string()));
                let matches = match pat.as_deref() {
                    Some("") | None => text.chars().count() + 1,
                    Some(p) => text.matches(p).count(),
                };
                s.saturating_add(matches.saturating_mul(to - from))
            } else {
                s
            };
            check_more(s.saturating_add(from).saturating_add(to).saturating_add(out.saturating_mul(esc)))?;
        }
        "indent" => {
            let s = fitting_display(v)?;
            let width = arg(1).cloned().or(kwarg("width")).and_then(|w| w.as_usize()).unwrap_or(4);
            let lines = v.as_str().map_or(s, |t| t.bytes().filter(|b| *b == b'\n').count()).saturating_add(1);
            check_more(s.saturating_add(width.saturating_mul(lines.saturating_add(1))).saturating_mul(esc))?;
        }
        "join" => {
            let sep = arg(1).cloned().or(kwarg("d")).map(|d| fitting_display(&d)).transpose()?.unwrap_or(0);
            let rem = remaining();
            let attribute = arg(2).cloned().or(kwarg("attribute"));
            // Every item's text plus a separator between two, counted
            // item by item until it passes what is left.
            let mut total = 0usize;
            let iter = v.try_iter().map_err(|_| Error::new(ErrorKind::InvalidOperation, "cannot join"));
            if let Ok(iter) = iter {
                for (i, item) in iter.enumerate() {
                    let item = match attribute.as_ref().and_then(|a| a.as_str()) {
                        Some(a) => path(&item, a),
                        None => item,
                    };
                    total = total
                        .saturating_add(display_len(&item, rem))
                        .saturating_add(if i > 0 { sep } else { 0 })
                        .saturating_add(VALUE_SIZE);
                    if total > rem {
                        return Err(refuse());
                    }
                }
            }
            check_more(total.saturating_mul(esc))?;
        }
        "split" | "lines" => {
            let s = fitting_display(v)?;
            let text = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
            let pieces = match (name, arg(1).and_then(|p| p.as_str())) {
                ("lines", _) => text.bytes().filter(|b| *b == b'\n').count() + 1,
                (_, Some("")) => text.chars().count() + 2,
                (_, Some(p)) => text.matches(p).count() + 1,
                (_, None) => text.split_whitespace().count(),
            };
            check_more(s.saturating_add(pieces.saturating_mul(VALUE_SIZE * 2)))?;
        }
        "pprint" => {
            let rem = remaining();
            if pretty_len(v, rem) > rem {
                return Err(refuse());
            }
        }
        "format" => {
            // Each `%` field shows one argument (or, with `%(key)s`, a value
            // of the map argument, whose text bounds it), padded to any
            // width written in the format string.
            let mut widest = 0usize;
            for a in args.iter().skip(1).filter(|a| !a.is_kwargs()) {
                widest = widest.max(fitting_display(a)?);
            }
            let mut total = fitting_display(v)?;
            if let Some(f) = v.as_str() {
                let fields = f.bytes().filter(|b| *b == b'%').count();
                total = total.saturating_add(fields.saturating_mul(widest));
                let mut digits = 0usize;
                for c in f.chars() {
                    if let Some(d) = c.to_digit(10) {
                        digits = digits.saturating_mul(10).saturating_add(d as usize);
                    } else {
                        total = total.saturating_add(digits);
                        digits = 0;
                    }
                }
                total = total.saturating_add(digits);
            }
            check_more(total.saturating_mul(esc))?;
        }
        // Materialise the items (pairs, keys, groups, a seen-set: a few
        // values per item).
        "list" | "unique" | "groupby" | "dictsort" | "sort" | "last" | "reverse" | "select" | "reject"
        | "selectattr" | "rejectattr" | "map" | "zip" => {
            let n = items_len(v, items_cap());
            let per_item = match name {
                "list" | "last" | "reverse" | "select" | "reject" | "selectattr" | "rejectattr" | "map" => 2,
                _ => 6,
            };
            check_items(n.saturating_mul(per_item))?;
            if name == "unique" || name == "sort" {
                // Case folding copies every string (times three at most).
                if let Some(s) = v.as_str() {
                    check_more(s.len().saturating_mul(CASE_FACTOR))?;
                }
            }
        }
        "batch" | "slice" => {
            let n = items_len(v, items_cap());
            let count = arg(1).and_then(|c| c.as_usize()).unwrap_or(1);
            // `slice` makes `count` lists, `batch` pads the last to `count`.
            check_items(n.saturating_mul(3).saturating_add(count.saturating_mul(4)))?;
        }
        "sum" => {
            // Summing strings or lists concatenates: their total.
            let start = arg(2).cloned().or(kwarg("start"));
            if let Some(start) = start.filter(|s| !s.is_number()) {
                let rem = remaining();
                let mut total = display_len(&start, rem);
                if let Ok(iter) = v.try_iter() {
                    for item in iter {
                        total = total.saturating_add(display_len(&item, rem)).saturating_add(VALUE_SIZE);
                        if total > rem {
                            return Err(refuse());
                        }
                    }
                }
                check_more(total)?;
            }
        }
        "chain" => {
            let n = args
                .iter()
                .filter(|a| !a.is_kwargs())
                .fold(0usize, |acc, a| acc.saturating_add(items_len(a, MAX_ITEMS)));
            check_lazy(n)?;
            check_items(n)?;
        }
        _ => {}
    }
    Ok(())
}

/// `item.a.b` as `map(attribute=..)` and `join(attribute=..)` read it.
fn path(item: &Value, path: &str) -> Value {
    let mut v = item.clone();
    for part in path.split('.') {
        v = match part.parse::<usize>() {
            Ok(i) => v.get_item(&Value::from(i)).unwrap_or_default(),
            Err(_) => v.get_attr(part).unwrap_or_default(),
        };
    }
    v
}

/// The tests that show a value as text (`startingwith`, `endingwith`,
/// `in` a string): that text must fit.
pub(super) fn pre_test(name: &str, args: &[Value]) -> Result<(), Error> {
    check_live()?;
    match name {
        "startingwith" | "endingwith" => {
            for a in args.iter().take(2) {
                fitting_display(a)?;
            }
        }
        "in" => {
            if let [needle, container, ..] = args
                && container.kind() == ValueKind::String
                && needle.kind() != ValueKind::String
            {
                fitting_display(needle)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// `dict(m)` and `namespace(m)` copy a map: a few values per entry.
pub(super) fn pre_copy(args: &[Value]) -> Result<(), Error> {
    check_live()?;
    if let Some(v) = args.first().filter(|v| !v.is_kwargs()) {
        check_items(items_len(v, items_cap()).saturating_mul(6))?;
    }
    Ok(())
}
