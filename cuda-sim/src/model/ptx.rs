//! Reading the kernel signatures of a PTX module: the `.entry` directives and their parameter
//! lists (PTX ISA, "Kernel Function Parameters" and "Kernel and Function Directives: .entry").
//! Nothing else of the module is read: kernel bodies are not run.

/// A kernel parameter: its size and alignment in bytes, and whether it can hold a pointer (a
/// 64-bit integer or bit-size scalar: `.u64`, `.s64`, `.b64`; compilers pass `T*` so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Param {
    pub(crate) size: usize,
    pub(crate) align: usize,
    pub(crate) pointer: bool,
}

/// A kernel: its name and parameters, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) params: Vec<Param>,
}

/// What is wrong with a module image.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not PTX text: a cubin or fatbin (named), or bytes that are not text.
    NotPtx(&'static str),
    /// PTX whose `.entry` directives cannot be read; the text says where.
    Invalid(String),
}

/// ELF (cubin), and the fatbin and fatbin-wrapper magic numbers, as stored (little-endian).
const ELF: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const FATBIN: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
const FATBIN_WRAPPER: [u8; 4] = 0x466B_43B1u32.to_le_bytes();

/// Classifies the first bytes of a module image: `Err` for a cubin or fatbin.
pub(crate) fn check_magic(head: &[u8]) -> Result<(), Refusal> {
    if head.starts_with(&ELF) {
        Err(Refusal::NotPtx("a cubin (an ELF image)"))
    } else if head.starts_with(&FATBIN) || head.starts_with(&FATBIN_WRAPPER) {
        Err(Refusal::NotPtx("a fatbin"))
    } else {
        Ok(())
    }
}

/// The text without its comments (`//` to the end of the line, `/* ... */`), comments
/// replaced by a space.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |n| &after[n..]);
            out.push(' ');
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |n| &after[n + 2..]);
            out.push(' ');
        } else if let Some(after) = rest.strip_prefix('"') {
            // A string (only in `.file` directives); kept whole.
            let end = after.find('"').map_or(after.len(), |n| n + 1);
            out.push('"');
            out.push_str(&after[..end]);
            rest = &after[end..];
        } else {
            let c = rest.chars().next().expect("not empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '%' | '.')
}

/// Size in bytes of a fundamental type (`.u32`, `.f64`, `.b8`, `.pred`, ...), and whether it
/// can hold a pointer.
fn fundamental(ty: &str) -> Option<(usize, bool)> {
    let (kind, bits) = ty.split_at(2.min(ty.len()));
    match (kind, bits) {
        (".u" | ".s" | ".b", "8") => Some((1, false)),
        (".u" | ".s" | ".b" | ".f", "16") => Some((2, false)),
        (".u" | ".s" | ".b" | ".f", "32") => Some((4, false)),
        (".u" | ".s" | ".b", "64") => Some((8, true)),
        (".f", "64") => Some((8, false)),
        _ if ty == ".pred" => Some((1, false)),
        _ if ty == ".bf16" || ty == ".e4m3" || ty == ".e5m2" => Some((2, false)),
        _ => None,
    }
}

/// One parameter declaration: `.param [.align N] .type [.ptr [.space] [.align N]] name[[N]]`.
fn param(decl: &str, entry: &str) -> Result<Param, String> {
    let bad = |why: &str| format!("parameter `{}` of `.entry {entry}`: {why}", decl.trim());
    let mut words = decl.split_whitespace().peekable();
    if words.next() != Some(".param") {
        return Err(bad("expected `.param`"));
    }
    let mut ty = None;
    let mut align = None;
    let mut name = None;
    while let Some(w) = words.next() {
        match w {
            ".align" => {
                let n = words.next().and_then(|n| n.parse::<usize>().ok());
                align = Some(n.ok_or_else(|| bad("`.align` without a number"))?);
            }
            ".ptr" | ".global" | ".const" | ".local" | ".shared" => {}
            _ if w.starts_with('.') && ty.is_none() => {
                ty = Some(fundamental(w).ok_or_else(|| bad("unknown type"))?);
            }
            _ => name = Some(w),
        }
    }
    let (elem, pointer) = ty.ok_or_else(|| bad("no type"))?;
    let name = name.ok_or_else(|| bad("no name"))?;
    let count = match name.split_once('[') {
        None => 1,
        Some((_, n)) => n
            .trim_end_matches(']')
            .trim()
            .parse::<usize>()
            .map_err(|_| bad("array length is not a number"))?,
    };
    Ok(Param {
        size: elem * count,
        align: align.unwrap_or(elem),
        pointer: pointer && count == 1,
    })
}

/// The `.entry` directives of a PTX module, in order.
pub(crate) fn entries(text: &str) -> Result<Vec<Entry>, Refusal> {
    let text = strip_comments(text);
    if !text.split_whitespace().any(|w| w == ".version") {
        return Err(Refusal::Invalid(
            "no `.version` directive: not PTX text".into(),
        ));
    }
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find(".entry") {
        let before_ok = rest[..at].chars().next_back().is_none_or(|c| !is_ident(c));
        rest = &rest[at + ".entry".len()..];
        if !before_ok || !rest.starts_with(char::is_whitespace) {
            continue;
        }
        let trimmed = rest.trim_start();
        let name_len = trimmed
            .find(|c: char| !is_ident(c))
            .unwrap_or(trimmed.len());
        let name = &trimmed[..name_len];
        if name.is_empty() {
            return Err(Refusal::Invalid("`.entry` without a name".into()));
        }
        rest = trimmed[name_len..].trim_start();
        let mut params = Vec::new();
        if let Some(list) = rest.strip_prefix('(') {
            let close = list
                .find(')')
                .ok_or_else(|| Refusal::Invalid(format!("`.entry {name}`: no `)`")))?;
            for decl in list[..close].split(',').filter(|d| !d.trim().is_empty()) {
                params.push(param(decl, name).map_err(Refusal::Invalid)?);
            }
            rest = &list[close + 1..];
        }
        out.push(Entry {
            name: name.to_string(),
            params,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = r#"
//
// Generated by a compiler; a comment with .entry fake( in it
//
.version 7.0
.target sm_52
.address_size 64

.visible .entry scale(
	.param .u64 .ptr .global .align 4 scale_param_0, // out
	.param .u64 scale_param_1,
	.param .f32 scale_param_2,
	.param .align 8 .b8 scale_param_3[16],
	.param .u32 scale_param_4
)
.maxntid 256, 1, 1
{
	ret;
}

/* .entry hidden(.param .u32 x) */
.entry _Z4noopv
{
	ret;
}
.func helper(.param .u64 p) { ret; }
"#;

    #[test]
    fn entries_and_their_parameters_are_read() {
        let e = entries(PTX).unwrap();
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!(e[0].name, "scale");
        let sizes: Vec<_> = e[0]
            .params
            .iter()
            .map(|p| (p.size, p.align, p.pointer))
            .collect();
        assert_eq!(
            sizes,
            [
                (8, 4, true),
                (8, 8, true),
                (4, 4, false),
                (16, 8, false),
                (4, 4, false)
            ]
        );
        assert_eq!(e[1].name, "_Z4noopv");
        assert!(e[1].params.is_empty());
    }

    #[test]
    fn binaries_and_broken_text_are_refused() {
        assert!(matches!(
            check_magic(b"\x7fELF\x02"),
            Err(Refusal::NotPtx(_))
        ));
        assert!(matches!(
            check_magic(&0xBA55_ED50u32.to_le_bytes()),
            Err(Refusal::NotPtx("a fatbin"))
        ));
        assert_eq!(check_magic(b".version 7.0"), Ok(()));
        assert!(matches!(entries("hello"), Err(Refusal::Invalid(_))));
        let Err(Refusal::Invalid(why)) = entries(".version 7.0\n.entry k(.param .q32 x)") else {
            panic!("an unknown type is refused");
        };
        assert!(
            why.contains("unknown type") && why.contains("`.entry k`"),
            "{why}"
        );
        assert!(matches!(
            entries(".version 7.0\n.entry k(.param .u32 x"),
            Err(Refusal::Invalid(_))
        ));
    }
}
