//! Rewrites a compiled template's instructions so the memory budget is
//! checked while it runs (see `budget.rs` for the why).
//!
//! minijinja compiles a template to a flat list of stack-machine
//! instructions. The copy made here is the same list with checks spliced
//! in, each a call of one of `budget`'s filters (a filter is looked up by
//! name once per render and cached under a local id, and a template can
//! neither define nor shadow one):
//!
//! - before an instruction that one step could make huge (`Emit`, `~`, `+`,
//!   `*`, `in`, unpacking, slicing): a pre-check of its operands. One
//!   operand: a filter that returns it unchanged. Several: a filter that
//!   takes them all and returns them as a list, and an `UnpackList` that
//!   puts them back on the stack in their order;
//! - after an instruction that grows memory (calls, concatenation,
//!   arithmetic on strings and lists, the end of a capture) and after each
//!   step of a loop (`Iterate`): a post-check of the value just pushed.
//!
//! Every jump target (`Jump*`, `Iterate`, a macro's `BuildMacro` offset)
//! is moved to where its instruction now starts, pre-checks included, and
//! every instruction keeps its source span and line, so errors point where
//! they did. `include`, `import`, `extends` and `block` are refused: an
//! included template would run the environment's original, unchecked
//! instructions, and each file of a package renders alone anyway.

use minijinja::machinery::{Instruction, Instructions};

use super::budget;

/// Filter local ids at or above this are not cached by minijinja
/// (`MAX_LOCALS`); such a call looks its filter up by name each time.
const MAX_LOCALS: u8 = 50;
const UNCACHED: u8 = !0;

/// The local ids given to the budget's filters: past the template's own.
struct Ids {
    next: u8,
    given: Vec<(&'static str, u8)>,
}

impl Ids {
    fn id(&mut self, name: &'static str) -> u8 {
        if let Some((_, id)) = self.given.iter().find(|(n, _)| *n == name) {
            return *id;
        }
        let id = if self.next < MAX_LOCALS { self.next } else { UNCACHED };
        self.next = self.next.saturating_add(1);
        self.given.push((name, id));
        id
    }
}

/// What is spliced in around one original instruction.
struct Guard {
    /// A pre-check filter and how many operands it takes from the stack.
    pre: Option<(&'static str, u16)>,
    /// Whether a post-check follows on the pushed value.
    post: bool,
}

fn guard(instr: &Instruction<'_>) -> Guard {
    use Instruction as I;
    let (pre, post) = match instr {
        I::Emit => (Some((budget::PRE_EMIT, 1)), false),
        I::StringConcat => (Some((budget::PRE_CONCAT, 2)), true),
        I::Add => (Some((budget::PRE_ADD, 2)), true),
        I::Mul => (Some((budget::PRE_MUL, 2)), true),
        I::In => (Some((budget::PRE_IN, 2)), false),
        // A chained comparison (`a < b in c`); its operator is not a public
        // type, and the check only acts when a string is searched.
        I::CompareAndPreserve(_) => (Some((budget::PRE_IN, 2)), false),
        I::UnpackList(_) => (Some((budget::PRE_UNPACK, 1)), false),
        I::UnpackLists(n) => (Some((budget::PRE_SPREAD, *n as u16)), true),
        I::Slice => (Some((budget::PRE_SLICE, 4)), true),
        // Filters check themselves (`builtins.rs`); these may run a
        // macro body (checked inside) or a function that allocates.
        I::CallFunction(..) | I::CallMethod(..) | I::CallObject(..) => (None, true),
        // A capture's text becomes a value (a copy); a loop step is where
        // a loop that grows memory a little each time is caught.
        I::EndCapture | I::Iterate(_) => (None, true),
        _ => (None, false),
    };
    Guard { pre, post }
}

/// Why a template cannot be rewritten.
#[derive(Debug)]
pub struct Refused(pub &'static str);

fn refused(instr: &Instruction<'_>) -> Option<Refused> {
    use Instruction as I;
    match instr {
        I::Include(_) => {
            Some(Refused("`include` and `import` are not available: each file of a package renders alone"))
        }
        I::LoadBlocks => Some(Refused("`extends` is not available: each file of a package renders alone")),
        I::CallBlock(_) | I::FastSuper => {
            Some(Refused("`block` is not available: each file of a package renders alone (use a macro)"))
        }
        _ => None,
    }
}

/// The original instruction `idx`, and where it came from in the source.
fn at<'i, 'a>(orig: &'i Instructions<'a>, idx: u32) -> Option<&'i Instruction<'a>> {
    orig.get(idx)
}

/// Adds `instr` with the source position of original instruction `idx`.
fn add<'a>(out: &mut Instructions<'a>, orig: &Instructions<'a>, idx: u32, instr: Instruction<'a>) {
    match (orig.get_span(idx), orig.get_line(idx)) {
        (Some(span), _) => out.add_with_span(instr, span),
        (None, Some(line)) => out.add_with_line(instr, line as u16),
        (None, None) => out.add(instr),
    };
}

/// The instructions of `orig` with the budget's checks spliced in.
pub fn rewrite<'a>(orig: &Instructions<'a>) -> Result<Instructions<'a>, Refused> {
    let mut len = 0u32;
    let mut ids = Ids { next: 0, given: Vec::new() };
    while let Some(instr) = at(orig, len) {
        if let Some(r) = refused(instr) {
            return Err(r);
        }
        if let Instruction::ApplyFilter(_, _, id) = instr
            && *id != UNCACHED
        {
            ids.next = ids.next.max(id.saturating_add(1));
        }
        len += 1;
    }

    // Where each original instruction starts in the copy (its pre-check,
    // if any): `start[len]` is the end, a valid jump target too.
    let mut start = Vec::with_capacity(len as usize + 1);
    let mut pos = 0u32;
    for idx in 0..len {
        start.push(pos);
        let g = guard(at(orig, idx).expect("counted above"));
        pos +=
            1 + match g.pre {
                Some((_, 1)) => 1,
                Some(_) => 2,
                None => 0,
            } + u32::from(g.post);
    }
    start.push(pos);
    let moved = |target: u32| start.get(target as usize).copied().unwrap_or(target);

    let mut out = Instructions::new(orig.name(), orig.source());
    for idx in 0..len {
        let instr = at(orig, idx).expect("counted above");
        let g = guard(instr);
        if let Some((name, n)) = g.pre {
            add(&mut out, orig, idx, Instruction::ApplyFilter(name, Some(n), ids.id(name)));
            if n > 1 {
                add(&mut out, orig, idx, Instruction::UnpackList(n as usize));
            }
        }
        let instr = match instr.clone() {
            Instruction::Jump(t) => Instruction::Jump(moved(t)),
            Instruction::JumpIfFalse(t) => Instruction::JumpIfFalse(moved(t)),
            Instruction::JumpIfFalseOrPop(t) => Instruction::JumpIfFalseOrPop(moved(t)),
            Instruction::JumpIfTrueOrPop(t) => Instruction::JumpIfTrueOrPop(moved(t)),
            Instruction::Iterate(t) => Instruction::Iterate(moved(t)),
            Instruction::BuildMacro(name, offset, flags) => Instruction::BuildMacro(name, moved(offset), flags),
            other => other,
        };
        add(&mut out, orig, idx, instr);
        if g.post {
            add(&mut out, orig, idx, Instruction::ApplyFilter(budget::POST, Some(1), ids.id(budget::POST)));
        }
    }
    Ok(out)
}
