//! The rewritten programs render exactly what minijinja renders: the same
//! bytes, or an error where minijinja errs. Compared against minijinja's
//! own `Template::render` in an environment configured the same way (its
//! default filters, tests and functions), on the example packages and on
//! generated templates that use every construct the rewrite touches.

use proptest::prelude::*;

use super::*;

const FIELD: &str = "roles.x.files[0].template";

/// minijinja as it comes, with the renderer's settings.
fn reference(source: &str, ctx: &Value) -> Result<String, String> {
    let mut env = Environment::new();
    env.set_fuel(Some(RENDER_FUEL));
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_debug(true);
    env.set_syntax(syntax());
    env.template_from_named_str(FIELD, source).and_then(|t| t.render(ctx)).map_err(|e| format!("{e}"))
}

fn ours(source: &str, ctx: &Value) -> Result<String, String> {
    render_source(FIELD, source, ctx).map_err(|e| e.message)
}

/// A context like the master's: three members, config, an instance.
fn context() -> Value {
    let member = |o: u32| {
        minijinja::context! { id => format!("c-server-{o}"), ordinal => o, host => format!("127.0.0.1{o}"),
        node => format!("n{o}"), ports => minijinja::context! { client => 5000 + o, peer => 6000 + o, http => 7000 + o, election => 8000 + o } }
    };
    minijinja::context! {
        component => minijinja::context! { name => "zookeeper", version => "3.8.0" },
        cluster => minijinja::context! { name => "c", id => "id-1",
            config => minijinja::context! { tick_time => 2000, heap => "small", tags => vec!["a", "b", "c"] },
            roles => minijinja::context! { server => minijinja::context! { count => 3, members => vec![member(1), member(2), member(3)] } } },
        instance => minijinja::context! { id => "c-server-2", ordinal => 2, role => "server", host => "127.0.0.12",
            node => "n2", ports => minijinja::context! { client => 5002, peer => 6002, http => 7002, election => 8002 },
            dir => "/srv/i/c-server-2", data_dir => "/srv/i/c-server-2/data" },
    }
}

fn same(source: &str) {
    let ctx = context();
    let (want, got) = (reference(source, &ctx), ours(source, &ctx));
    match (&want, &got) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{source}"),
        // Error texts: minijinja's, behind "template error: ".
        (Err(a), Err(b)) => assert_eq!(format!("template error: {a}"), *b, "{source}"),
        _ => panic!("minijinja: {want:?}\nrewritten: {got:?}\n{source}"),
    }
}

#[test]
fn the_example_packages_render_byte_identically() {
    let mut n = 0;
    for dir in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/components")).unwrap() {
        let text = std::fs::read_to_string(dir.unwrap().path().join("component.toml")).unwrap();
        let spec = crate::spec::ComponentSpec::parse(&text).unwrap();
        for role in &spec.roles {
            for file in &role.files {
                same(&file.template);
                n += 1;
            }
            for template in role.env.values() {
                same(template);
                n += 1;
            }
        }
    }
    assert!(n >= 3, "only {n} templates found");
}

#[test]
fn constructs_the_rewrite_touches_render_byte_identically() {
    for t in [
        "{% for m in cluster.roles.server.members %}server.{{ m.ordinal }}={{ m.host }}:{{ m.ports.peer }}\n{% endfor %}",
        "{% for m in cluster.roles.server.members %}{{ loop.index }}/{{ loop.length }}{% if loop.last %}.{% else %},{% endif %}{% endfor %}",
        "{% for x in [] %}a{% else %}empty{% endfor %}",
        "{% macro row(m, sep=':') %}{{ m.host }}{{ sep }}{{ m.ports.client }}{% endmacro %}{% for m in cluster.roles.server.members %}{{ row(m) }} {{ row(m, sep='/') }}\n{% endfor %}",
        "{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call wrap('b') %}{{ instance.host }}{% endcall %}",
        "{% macro w() %}[{{ caller(1) }}|{{ caller(2) }}]{% endmacro %}{% call(x) w() %}{{ x * 10 }}{% endcall %}",
        "{% for item in [[1, [2, 3]], 4] recursive %}{% if item is iterable %}({{ loop(item) }}){% else %}{{ item }}{% endif %}{% endfor %}",
        "{% set ns = namespace(n=0, s='') %}{% for m in cluster.roles.server.members %}{% set ns.n = ns.n + m.ordinal %}{% set ns.s = ns.s ~ m.node %}{% endfor %}{{ ns.n }} {{ ns.s }}",
        "{% set x %}captured {{ instance.id }}{% endset %}{{ x|upper }}",
        "{% filter upper %}loud {{ instance.role }}{% endfilter %}",
        "{% if instance.ordinal == 1 %}one{% elif instance.ordinal == 2 %}two{% else %}many{% endif %}",
        "{{ 1 < instance.ordinal < 3 }} {{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'z' not in cluster.config.tags }}",
        "{{ cluster.config }} {{ cluster.roles.server.members[0] }} {{ cluster.config.tags ~ '!' }}",
        "{{ (cluster.config.tags + ['d'])|join(',') }} {{ cluster.config.tags * 2 }} {{ 'ab' * 3 }} {{ (1, 2) + (3,) }}",
        "{% set a, b = [1, 2] %}{{ a + b }} {{ dict(*[['k', 'v']]) }} {{ cluster.config.tags[1:] }} {{ 'hello'[::-1] }} {{ (1, 2, 3)[1:] }}",
        "{{ cluster.config.heap|replace('s', 'S')|indent(2, true) }}{{ 'a\nb'|indent(4) }}|{{ '%s-%05d'|format('x', 42) }}",
        "{{ cluster.roles.server.members|map(attribute='host')|join(', ') }} {{ cluster.roles.server.members|selectattr('ordinal', 'odd')|map(attribute='node')|list }}",
        "{{ [3, 1, 2]|sort }} {{ 'a b  c'|split }} {{ 'x\ny'|lines }} {{ [1, 2, 3]|batch(2)|list }} {{ [1, 2, 3]|slice(2, 0)|list }} {{ [1, 1, 2]|unique|list }}",
        "{{ cluster.config|dictsort }} {{ cluster.config|items|list|length }} {{ [1, 2]|chain([3])|list }} {{ [1, 2]|zip([3, 4])|list }} {{ [1, 2]|sum(start=10) }}",
        "{{ cluster.config|pprint }} {{ cluster.config.tags|string }} {{ 'Ab'|lower }}{{ 'ab'|title }}{{ 'ab'|capitalize }} {{ '<&>'|e }} {{ ' x '|trim }}",
        "{{ instance.nope|default('dflt') }} {{ 'x' is startingwith 'x' }} {{ range(3)|list }} {{ namespace(a=1).a }}",
        "{% with p = instance.ports %}{{ p.client }}{% endwith %}{% autoescape true %}{{ '<x>' }}{% endautoescape %}",
        "line one\nport={{ instance.ports.admin }}\n",
        "{{ undefined_thing }}",
        "{% for x in 3 %}{% endfor %}",
        "{{ 1 / 0 }}",
        "{{ [1, 2]|batch(0) }}",
        "{% set a, b = [1, 2, 3] %}",
        "{{ nope() }}",
        "{{ cluster.config.tags.nope() }}",
    ] {
        same(t);
    }
}

/// Pieces of template that nest: (`open`, `close`) around generated bodies.
fn block() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("text ".to_string()),
        Just("{{ instance.host }}".to_string()),
        Just("{{ m }}".to_string()),
        Just("{{ ns.n }}".to_string()),
        Just("{{ m ~ '-' ~ instance.ordinal }}".to_string()),
        Just("{{ (m * 2)|string + 'x' }}".to_string()),
        Just("{% set ns.n = ns.n + 1 %}".to_string()),
        Just("{{ [m, m]|join(':') }}".to_string()),
        Just("{{ mac(m) }}".to_string()),
        Just("{{ m is odd }}".to_string()),
        Just("{{ m in [1, 3] }}".to_string()),
        Just("{{ cluster.roles.server.members[m % 3].host|upper }}".to_string()),
        Just("{{ loop.index if loop is defined else '-' }}".to_string()),
        Just("{{ nope }}".to_string()),
        Just("\n".to_string()),
    ];
    leaf.prop_recursive(4, 48, 4, |inner| {
        prop::collection::vec(inner, 1..4).prop_map(|v| v.concat()).prop_flat_map(|body| {
            prop_oneof![
                Just(format!("{{% for m in [1, 2, 3] %}}{body}{{% endfor %}}")),
                Just(format!("{{% for m in range(2) %}}{body}{{% else %}}none{{% endfor %}}")),
                Just(format!(
                    "{{% if m is defined and m > 1 %}}{body}{{% elif ns.n > 2 %}}e{{% else %}}{body}{{% endif %}}"
                )),
                Just(format!("{{% set cap %}}{body}{{% endset %}}[{{{{ cap|length }}}}]")),
                Just(format!("{{% filter upper %}}{body}{{% endfilter %}}")),
                Just(format!("{{% call mac(7) %}}{body}{{% endcall %}}")),
                Just(format!("{{% with m = 5 %}}{body}{{% endwith %}}")),
            ]
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn generated_templates_render_byte_identically(body in block()) {
        let t = format!(
            "{{% set ns = namespace(n=0) %}}{{% macro mac(v) %}}<{{{{ v }}}}{{% if caller is defined %}}{{{{ caller() }}}}{{% endif %}}>{{% endmacro %}}{body}"
        );
        same(&t);
    }
}
