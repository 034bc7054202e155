//! `Config::parse_with_env` on arbitrary text and arbitrary `${…}` strings.
//!
//! Byte 0 picks the mode, the rest is the input (lossily UTF-8):
//! - even: the input is the whole config file (TOML-ish text);
//! - odd: the input is one string value, quoted as a TOML basic string and
//!   placed at one of several keys of an otherwise valid file, so `${…}`
//!   expansion sees arbitrary strings while the TOML always parses.
//!
//! The environment is a pure function of the variable name (set, empty,
//! unset, or a value that itself contains `${…}` and `$$`, which must not be
//! expanded again). Property: never panics.
#![no_main]

use idemgate::Config;
use libfuzzer_sys::fuzz_target;

fn env(name: &str) -> Option<String> {
    match name {
        "IDEMGATE_ADMIN_TOKEN" => Some("0123456789abcdef0123".into()),
        "DATABASE_URL" | "IDEMGATE_STORE" => Some("memory://".into()),
        "PORT" => Some("8080".into()),
        "UPSTREAM" => Some("http://127.0.0.1:9000".into()),
        "EMPTY" => Some(String::new()),
        _ => match name.len() % 4 {
            0 => None,
            1 => Some(String::new()),
            2 => Some(name.to_string()),
            _ => Some("${NESTED}$${x".into()),
        },
    }
}

const TEMPLATES: &[&str] = &[
    "listen = {v}\n[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n",
    "admin_listen = {v}\nadmin_token = {v}\n[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n",
    "[store]\nurl = {v}\n[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n",
    "[store]\nurl = \"memory://\"\ntimeout = {v}\nreplay_cache_size = {v}\nprefix = {v}\n[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n",
    "[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = {v}\n",
    "[[routes]]\nname = {v}\nmatch = {v}\nupstream = \"http://127.0.0.1:9000\"\n",
    "[defaults]\nretention = {v}\nlease = {v}\nupstream_timeout = {v}\nmax_request_body = {v}\n[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n",
    "[defaults]\nmethods = [{v}]\nkey_header = {v}\nscope_header = {v}\n[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n",
    "[defaults]\nrecord = [{v}, \"2xx\"]\nreplay_headers = [{v}]\non_store_error = {v}\n[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n",
    "[defaults.fingerprint]\nheaders = [{v}]\nbody = \"json\"\nexclude = [{v}, {v}]\n[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n",
    "docs_url = {v}\nlog_format = {v}\n[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n",
    "{k} = {v}\n[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n",
    "[[routes]]\nname = \"p\"\nmatch = \"/v1/*\"\nupstream = \"http://127.0.0.1:9000\"\n{k} = {v}\n",
];

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let input = String::from_utf8_lossy(rest);
    if mode % 2 == 0 {
        let _ = Config::parse_with_env(&input, &env);
    } else {
        let quoted = toml::Value::String(input.clone().into_owned()).to_string();
        let key = toml::Value::String(input.into_owned()).to_string();
        let template = TEMPLATES[(mode as usize / 2) % TEMPLATES.len()];
        let text = template.replace("{v}", &quoted).replace("{k}", &key);
        let _ = Config::parse_with_env(&text, &env);
    }
});
