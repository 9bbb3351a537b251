//! The JSON Schema files in policies/schemas agree with the code: the shipped examples (and a
//! freshly signed receipt) validate against them, and the same documents parse with the kernel's
//! deny-unknown-fields types. The validator covers the subset the schemas use.

#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};

fn load(rel: &str) -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn validate(schema: &Value, v: &Value, at: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if let Some(c) = schema.get("const") {
        if c != v {
            errs.push(format!("{at}: not {c}"));
        }
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            errs.push(format!("{at}: {v} not in {e:?}"));
        }
    }
    if let Some(alts) = schema.get("oneOf").and_then(Value::as_array) {
        if alts.iter().filter(|s| validate(s, v, at).is_empty()).count() != 1 {
            errs.push(format!("{at}: matches not exactly one alternative"));
        }
    }
    match (schema.get("type").and_then(Value::as_str), v) {
        (Some("object"), Value::Object(m)) => {
            let props = schema.get("properties").and_then(Value::as_object);
            for r in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
                if !m.contains_key(r.as_str().unwrap()) {
                    errs.push(format!("{at}: missing {r}"));
                }
            }
            for (k, x) in m {
                match props.and_then(|p| p.get(k)) {
                    Some(s) => errs.extend(validate(s, x, &format!("{at}.{k}"))),
                    None if schema.get("additionalProperties") == Some(&json!(false)) => {
                        errs.push(format!("{at}: unknown {k}"))
                    }
                    None => {}
                }
            }
        }
        (Some("array"), Value::Array(a)) => {
            for (i, x) in a.iter().enumerate() {
                errs.extend(validate(&schema["items"], x, &format!("{at}[{i}]")));
            }
        }
        (Some("string"), Value::String(_))
        | (Some("integer"), Value::Number(_))
        | (Some("boolean"), Value::Bool(_)) => {}
        (Some(t), _) => errs.push(format!("{at}: not a {t}")),
        (None, _) => {}
    }
    errs
}

#[test]
fn examples_validate_and_parse() {
    let manifest = load("policies/examples/manifest.json");
    let schema = load("policies/schemas/chio.tool-manifest.v1.json");
    assert_eq!(validate(&schema, &manifest, "manifest"), Vec::<String>::new());
    chio_kernel::documents::manifest_from(manifest).unwrap();
    let text = serde_json::to_string(&load("policies/examples/policy.json"))
        .unwrap()
        .replace("PUBLISHER_KEY", &"e".repeat(64));
    let policy: Value = serde_json::from_str(&text).unwrap();
    let schema = load("policies/schemas/chio.cage-launch-policy.v1.json");
    assert_eq!(validate(&schema, &policy, "policy"), Vec::<String>::new());
    chio_kernel::documents::policy_from(policy).unwrap();
}

#[test]
fn the_repository_workspace_example_validates() {
    let schema = load("policies/schemas/chio.repository.workspace.v1.json");
    let example = load("policies/examples/repository-workspace.json");
    assert_eq!(validate(&schema, &example, "workspace"), Vec::<String>::new());
    let mut extra = example.clone();
    extra["surprise"] = json!(1);
    assert!(!validate(&schema, &extra, "workspace").is_empty());
}

#[test]
fn a_signed_receipt_validates() {
    let key = chio_kernel::keys::generate().unwrap();
    let body = chio_kernel::receipt::Body {
        schema: chio_kernel::receipt::SCHEMA.into(),
        kind: chio_kernel::receipt::Kind::Denial,
        seq: 1,
        prev: chio_kernel::receipt::GENESIS.into(),
        issued_at: chio_kernel::time::rfc3339(0),
        tool_server: Some("x".into()),
        outcome: "denied".into(),
        launch_record: None,
        launch: None,
        detail: Some(json!({"violations": ["a"]})),
    };
    let env = serde_json::to_value(chio_kernel::receipt::sign(&key, &body).unwrap()).unwrap();
    let receipt_schema = load("policies/schemas/chio.receipt.v1.json");
    assert_eq!(
        validate(&load("policies/schemas/chio.signed-envelope.v1.json"), &env, "envelope"),
        Vec::<String>::new()
    );
    assert_eq!(validate(&receipt_schema, &env["body"], "receipt"), Vec::<String>::new());
    let mut extra = env["body"].clone();
    extra["surprise"] = json!(1);
    assert!(!validate(&receipt_schema, &extra, "receipt").is_empty());
}
