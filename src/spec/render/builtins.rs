//! The filters, tests and functions a template may call: minijinja 3.0.5's
//! own built-ins, each behind the memory budget (`budget.rs`).
//!
//! The environment starts empty (`Environment::empty`), so nothing reaches
//! a template that is not listed here; the lists are those of minijinja's
//! `defaults.rs` for the pinned version (re-audit them when upgrading).
//! Each filter is the built-in itself (the same function minijinja
//! registers), called with the arguments untouched, so results and error
//! messages are minijinja's; around it, the budget's estimate of what it
//! may add runs first and the live-bytes check after.
//!
//! Left out: `debug()`, which prints the whole render state (every
//! variable) as one string; a config template has no use for it.

use minijinja::value::{Rest, Value, ValueOrKwargs};
use minijinja::{Environment, Error, State, filters, functions, tests};

use super::budget;

/// Adds `name` as a filter: the budget's estimate, `original`, the check.
fn filter(env: &mut Environment<'static>, name: &'static str, original: Value) {
    env.add_filter(name, move |state: &mut State, args: Rest<ValueOrKwargs>| -> Result<Value, Error> {
        let args: Vec<Value> = args.0.into_iter().map(ValueOrKwargs::into_value).collect();
        budget::pre_filter(name, state, &args)?;
        let rv = original.call(state, &args)?;
        budget::check_live()?;
        Ok(rv)
    });
}

/// Adds `name` as a test: the budget's estimate, then `original`.
fn test(env: &mut Environment<'static>, name: &'static str, original: Value) {
    env.add_test(name, move |state: &mut State, args: Rest<ValueOrKwargs>| -> Result<bool, Error> {
        let args: Vec<Value> = args.0.into_iter().map(ValueOrKwargs::into_value).collect();
        budget::pre_test(name, &args)?;
        Ok(original.call(state, &args)?.is_true())
    });
}

/// Adds `name` as a global function: the estimate of a copied map, the
/// original, the check.
fn function(env: &mut Environment<'static>, name: &'static str, original: Value) {
    env.add_function(name, move |state: &mut State, args: Rest<ValueOrKwargs>| -> Result<Value, Error> {
        let args: Vec<Value> = args.0.into_iter().map(ValueOrKwargs::into_value).collect();
        budget::pre_copy(&args)?;
        let rv = original.call(state, &args)?;
        budget::check_live()?;
        Ok(rv)
    });
}

/// Every filter of minijinja's `defaults.rs` (builtins on, `json` and
/// `urlencode` off, as flotilla builds it).
pub fn filters() -> Vec<(&'static str, Value)> {
    vec![
        ("safe", Value::from_function(filters::safe)),
        ("escape", Value::from_function(filters::escape)),
        ("e", Value::from_function(filters::escape)),
        ("lower", Value::from_function(filters::lower)),
        ("upper", Value::from_function(filters::upper)),
        ("title", Value::from_function(filters::title)),
        ("capitalize", Value::from_function(filters::capitalize)),
        ("replace", Value::from_function(filters::replace)),
        ("length", Value::from_function(filters::length)),
        ("count", Value::from_function(filters::length)),
        ("dictsort", Value::from_function(filters::dictsort)),
        ("items", Value::from_function(filters::items)),
        ("reverse", Value::from_function(filters::reverse)),
        ("trim", Value::from_function(filters::trim)),
        ("join", Value::from_function(filters::join)),
        ("split", Value::from_function(filters::split)),
        ("lines", Value::from_function(filters::lines)),
        ("default", Value::from_function(filters::default)),
        ("d", Value::from_function(filters::default)),
        ("round", Value::from_function(filters::round)),
        ("abs", Value::from_function(filters::abs)),
        ("int", Value::from_function(filters::int)),
        ("float", Value::from_function(filters::float)),
        ("attr", Value::from_function(filters::attr)),
        ("first", Value::from_function(filters::first)),
        ("last", Value::from_function(filters::last)),
        ("min", Value::from_function(filters::min)),
        ("max", Value::from_function(filters::max)),
        ("sort", Value::from_function(filters::sort)),
        ("list", Value::from_function(filters::list)),
        ("string", Value::from_function(filters::string)),
        ("bool", Value::from_function(filters::bool)),
        ("batch", Value::from_function(filters::batch)),
        ("slice", Value::from_function(filters::slice)),
        ("sum", Value::from_function(filters::sum)),
        ("indent", Value::from_function(filters::indent)),
        ("select", Value::from_function(filters::select)),
        ("reject", Value::from_function(filters::reject)),
        ("selectattr", Value::from_function(filters::selectattr)),
        ("rejectattr", Value::from_function(filters::rejectattr)),
        ("map", Value::from_function(filters::map)),
        ("groupby", Value::from_function(filters::groupby)),
        ("unique", Value::from_function(filters::unique)),
        ("chain", Value::from_function(filters::chain)),
        ("zip", Value::from_function(filters::zip)),
        ("pprint", Value::from_function(filters::pprint)),
        ("format", Value::from_function(filters::format)),
    ]
}

/// Every test of minijinja's `defaults.rs`.
pub fn tests() -> Vec<(&'static str, Value)> {
    vec![
        ("undefined", Value::from_function(tests::is_undefined)),
        ("defined", Value::from_function(tests::is_defined)),
        ("none", Value::from_function(tests::is_none)),
        ("safe", Value::from_function(tests::is_safe)),
        ("escaped", Value::from_function(tests::is_safe)),
        ("boolean", Value::from_function(tests::is_boolean)),
        ("odd", Value::from_function(tests::is_odd)),
        ("even", Value::from_function(tests::is_even)),
        ("divisibleby", Value::from_function(tests::is_divisibleby)),
        ("number", Value::from_function(tests::is_number)),
        ("integer", Value::from_function(tests::is_integer)),
        ("int", Value::from_function(tests::is_integer)),
        ("float", Value::from_function(tests::is_float)),
        ("string", Value::from_function(tests::is_string)),
        ("sequence", Value::from_function(tests::is_sequence)),
        ("iterable", Value::from_function(tests::is_iterable)),
        ("mapping", Value::from_function(tests::is_mapping)),
        ("startingwith", Value::from_function(tests::is_startingwith)),
        ("endingwith", Value::from_function(tests::is_endingwith)),
        ("lower", Value::from_function(tests::is_lower)),
        ("upper", Value::from_function(tests::is_upper)),
        ("sameas", Value::from_function(tests::is_sameas)),
        ("eq", Value::from_function(tests::is_eq)),
        ("equalto", Value::from_function(tests::is_eq)),
        ("==", Value::from_function(tests::is_eq)),
        ("ne", Value::from_function(tests::is_ne)),
        ("!=", Value::from_function(tests::is_ne)),
        ("lt", Value::from_function(tests::is_lt)),
        ("lessthan", Value::from_function(tests::is_lt)),
        ("<", Value::from_function(tests::is_lt)),
        ("le", Value::from_function(tests::is_le)),
        ("<=", Value::from_function(tests::is_le)),
        ("gt", Value::from_function(tests::is_gt)),
        ("greaterthan", Value::from_function(tests::is_gt)),
        (">", Value::from_function(tests::is_gt)),
        ("ge", Value::from_function(tests::is_ge)),
        (">=", Value::from_function(tests::is_ge)),
        ("in", Value::from_function(tests::is_in)),
        ("true", Value::from_function(tests::is_true)),
        ("false", Value::from_function(tests::is_false)),
        ("filter", Value::from_function(tests::is_filter)),
        ("test", Value::from_function(tests::is_test)),
    ]
}

/// The global functions of minijinja's `defaults.rs` but `debug`. `range`
/// stays as it is: minijinja caps it at 100,000 numbers, made lazily.
pub fn globals() -> Vec<(&'static str, Value)> {
    vec![("dict", Value::from_function(functions::dict)), ("namespace", Value::from_function(functions::namespace))]
}

/// Puts every filter, test and function above into `env`, behind the budget.
pub(super) fn install(env: &mut Environment<'static>) {
    for (name, original) in filters() {
        filter(env, name, original);
    }
    for (name, original) in tests() {
        test(env, name, original);
    }
    env.add_function("range", functions::range);
    for (name, original) in globals() {
        function(env, name, original);
    }
}
