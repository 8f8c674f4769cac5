//! The memory a template's compilation may take: minijinja folds constant
//! expressions while it compiles, so `{{ 'x' * 100000000 }}` would build a
//! 100 MB string at package upload, before any render (and before the
//! render-time budget could look), and thirty such lines 3 GB.
//!
//! So before minijinja compiles a template, its syntax tree is walked here
//! and every expression minijinja would fold is sized without building it:
//! literals by their text, `~` and `+` by the sum of their sides, `*` by
//! the repeated side times the count (the count itself, a small constant,
//! is computed). A template whose folded constants would pass
//! [`MAX_CONSTANT_BYTES`] is refused.

use minijinja::machinery::ast::{self, BinOpKind, CallArg, Expr, Stmt};

use super::budget::{VALUE_SIZE, display_len};

/// The most bytes the constants of one template may take: a rendered file
/// is at most this big (`MAX_RENDERED_BYTES`), so no honest constant is
/// bigger.
pub const MAX_CONSTANT_BYTES: usize = 1024 * 1024;

/// The bytes minijinja's folding of `expr` would allocate (its result and
/// every intermediate), or `None` if minijinja does not fold it. Mirrors
/// `Expr::as_const` of minijinja 3.0.5.
fn folded(expr: &Expr<'_>) -> Option<usize> {
    let cap = MAX_CONSTANT_BYTES;
    match expr {
        Expr::Const(c) => Some(display_len(&c.value, cap).saturating_add(VALUE_SIZE)),
        // Only lists, tuples and maps of literals fold.
        Expr::List(l) => literals(&l.items),
        Expr::Tuple(t) => literals(&t.items),
        Expr::Map(m) => {
            let keys = literals(&m.keys)?;
            Some(keys.saturating_add(literals(&m.values)?))
        }
        Expr::UnaryOp(u) => folded(&u.expr).map(|n| n.saturating_add(VALUE_SIZE)),
        Expr::BinOp(b) => {
            let (l, r) = (folded(&b.left)?, folded(&b.right)?);
            let operands = l.saturating_add(r);
            let result = match b.op {
                BinOpKind::Add | BinOpKind::Concat => operands,
                BinOpKind::Mul if operands <= cap => repeated(&b.left, &b.right),
                // An operand already too big: no need to know more.
                BinOpKind::Mul => operands,
                _ => VALUE_SIZE,
            };
            Some(operands.saturating_add(result))
        }
        Expr::Compare(c) => {
            let mut n = folded(&c.expr)?;
            for op in &c.ops {
                n = n.saturating_add(folded(&op.expr)?);
            }
            Some(n)
        }
        _ => None,
    }
}

fn literals(items: &[Expr<'_>]) -> Option<usize> {
    if !items.iter().all(|e| matches!(e, Expr::Const(_))) {
        return None;
    }
    items.iter().try_fold(0usize, |acc, e| folded(e).map(|n| acc.saturating_add(n)))
}

/// The size of `left * right` for two small folded operands, computed
/// from their values (cheap: both are at most `MAX_CONSTANT_BYTES`).
fn repeated(left: &Expr<'_>, right: &Expr<'_>) -> usize {
    let (Some(a), Some(b)) = (left.as_const(), right.as_const()) else {
        return VALUE_SIZE;
    };
    let (what, n) = if a.as_usize().is_some() && !b.is_number() { (b, a) } else { (a, b) };
    let Some(n) = n.as_usize() else {
        return VALUE_SIZE;
    };
    if let Some(s) = what.as_str() {
        s.len().saturating_mul(n)
    } else if what.is_tuple() {
        what.len().unwrap_or(0).saturating_mul(n).saturating_mul(VALUE_SIZE)
    } else {
        // A list repeated is lazy.
        VALUE_SIZE
    }
}

/// Adds up what the folded expressions in `stmt` would take.
struct Sizer {
    total: usize,
}

impl Sizer {
    fn expr(&mut self, e: &Expr<'_>) {
        if let Some(n) = folded(e) {
            self.total = self.total.saturating_add(n);
            return;
        }
        match e {
            Expr::Var(_) | Expr::Const(_) => {}
            Expr::Slice(s) => {
                self.expr(&s.expr);
                for part in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                    self.expr(part);
                }
            }
            Expr::UnaryOp(u) => self.expr(&u.expr),
            Expr::BinOp(b) => {
                self.expr(&b.left);
                self.expr(&b.right);
            }
            Expr::Compare(c) => {
                self.expr(&c.expr);
                for op in &c.ops {
                    self.expr(&op.expr);
                }
            }
            Expr::IfExpr(i) => {
                self.expr(&i.test_expr);
                self.expr(&i.true_expr);
                if let Some(f) = &i.false_expr {
                    self.expr(f);
                }
            }
            Expr::Filter(f) => {
                if let Some(e) = &f.expr {
                    self.expr(e);
                }
                self.args(&f.args);
            }
            Expr::Test(t) => {
                self.expr(&t.expr);
                self.args(&t.args);
            }
            Expr::GetAttr(g) => self.expr(&g.expr),
            Expr::GetItem(g) => {
                self.expr(&g.expr);
                self.expr(&g.subscript_expr);
            }
            Expr::Call(c) => self.call(c),
            Expr::List(l) => l.items.iter().for_each(|e| self.expr(e)),
            Expr::Tuple(t) => t.items.iter().for_each(|e| self.expr(e)),
            Expr::Map(m) => m.keys.iter().chain(m.values.iter()).for_each(|e| self.expr(e)),
        }
    }

    fn call(&mut self, c: &ast::Call<'_>) {
        self.expr(&c.expr);
        self.args(&c.args);
    }

    fn args(&mut self, args: &[CallArg<'_>]) {
        for a in args {
            match a {
                CallArg::Pos(e) | CallArg::Kwarg(_, e) | CallArg::PosSplat(e) | CallArg::KwargSplat(e) => self.expr(e),
            }
        }
    }

    fn body(&mut self, stmts: &[Stmt<'_>]) {
        stmts.iter().for_each(|s| self.stmt(s));
    }

    fn stmt(&mut self, s: &Stmt<'_>) {
        match s {
            Stmt::Template(t) => self.body(&t.children),
            Stmt::EmitExpr(e) => self.expr(&e.expr),
            Stmt::EmitRaw(_) => {}
            Stmt::ForLoop(f) => {
                self.expr(&f.target);
                self.expr(&f.iter);
                if let Some(e) = &f.filter_expr {
                    self.expr(e);
                }
                self.body(&f.body);
                self.body(&f.else_body);
            }
            Stmt::IfCond(i) => {
                self.expr(&i.expr);
                self.body(&i.true_body);
                self.body(&i.false_body);
            }
            Stmt::WithBlock(w) => {
                for (a, b) in &w.assignments {
                    self.expr(a);
                    self.expr(b);
                }
                self.body(&w.body);
            }
            Stmt::Set(x) => {
                self.expr(&x.target);
                self.expr(&x.expr);
            }
            Stmt::SetBlock(x) => {
                self.expr(&x.target);
                if let Some(f) = &x.filter {
                    self.expr(f);
                }
                self.body(&x.body);
            }
            Stmt::AutoEscape(a) => {
                self.expr(&a.enabled);
                self.body(&a.body);
            }
            Stmt::FilterBlock(f) => {
                self.expr(&f.filter);
                self.body(&f.body);
            }
            Stmt::Block(b) => self.body(&b.body),
            Stmt::Import(i) => {
                self.expr(&i.expr);
                self.expr(&i.name);
            }
            Stmt::FromImport(i) => {
                self.expr(&i.expr);
                for (a, b) in &i.names {
                    self.expr(a);
                    if let Some(b) = b {
                        self.expr(b);
                    }
                }
            }
            Stmt::Extends(e) => self.expr(&e.name),
            Stmt::Include(i) => self.expr(&i.name),
            Stmt::Macro(m) => self.macro_decl(m),
            Stmt::CallBlock(c) => {
                self.call(&c.call);
                self.macro_decl(&c.macro_decl);
            }
            Stmt::Do(d) => self.call(&d.call),
        }
    }

    fn macro_decl(&mut self, m: &ast::Macro<'_>) {
        m.args.iter().chain(m.defaults.iter()).for_each(|e| self.expr(e));
        self.body(&m.body);
    }
}

/// Refuses a template whose constants minijinja would fold into more than
/// [`MAX_CONSTANT_BYTES`]; parses it (with the syntax it is compiled with)
/// without compiling it. A syntax error is left to the compiler to report.
pub fn check(name: &str, source: &str, syntax: minijinja::syntax::SyntaxConfig) -> Result<(), String> {
    let Ok(tree) = minijinja::machinery::parse(source, name, syntax) else {
        return Ok(());
    };
    let mut sizer = Sizer { total: 0 };
    sizer.stmt(&tree);
    if sizer.total > MAX_CONSTANT_BYTES {
        return Err(format!(
            "its constant expressions take more than {} KiB (the limit of a template's constants)",
            MAX_CONSTANT_BYTES / 1024
        ));
    }
    Ok(())
}
