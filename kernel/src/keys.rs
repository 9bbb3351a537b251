//! Ed25519 keys. Keys and signatures travel as lowercase hex. A secret seed file is written 0600
//! and refused when group or others can read it or when neither its reader nor root owns it;
//! weak (small-order) public keys are refused; verification is `verify_strict`.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub use ed25519_dalek::SigningKey;
use ed25519_dalek::{Signature, Signer, VerifyingKey};

/// Why a key or signature was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// Not lowercase hex of the right length.
    Encoding(String),
    /// A small-order or otherwise unusable public key.
    WeakKey,
    /// The seed file is readable by group or others.
    Permissions(String),
    /// File system error.
    Io(String),
    /// The signature does not verify under the key.
    BadSignature,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::Encoding(e) => write!(f, "{e}"),
            KeyError::WeakKey => write!(f, "the public key is weak (small order) and is refused"),
            KeyError::Permissions(e) => write!(f, "{e}"),
            KeyError::Io(e) => write!(f, "{e}"),
            KeyError::BadSignature => write!(f, "the signature does not verify under the pinned key"),
        }
    }
}

impl std::error::Error for KeyError {}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decode exactly `N` bytes of lowercase hex.
pub fn unhex<const N: usize>(s: &str, what: &str) -> Result<[u8; N], KeyError> {
    let bad = || KeyError::Encoding(format!("{what} must be {} lowercase hex digits", 2 * N));
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(bad());
    }
    let mut out = [0u8; N];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let pair = std::str::from_utf8(chunk).map_err(|_| bad())?;
        out[i] = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// A pinned public key as a caller gives it — 64 hex digits, or a file holding them — checked,
/// as hex.
pub fn pinned(arg: &str) -> Result<String, KeyError> {
    let hex = if arg.len() == 64 && arg.bytes().all(|b| b.is_ascii_hexdigit()) {
        arg.to_string()
    } else {
        fs::read_to_string(arg).map_err(|e| KeyError::Io(format!("reading key file {arg}: {e}")))?.trim().to_string()
    };
    public_key(&hex).map_err(|e| KeyError::Encoding(format!("trusted kernel key {hex:?}: {e}")))?;
    Ok(hex)
}

/// A public key accepted for verification (strictly decoded, not weak).
pub fn public_key(hex_key: &str) -> Result<VerifyingKey, KeyError> {
    let bytes = unhex::<32>(hex_key, "public key")?;
    let key = VerifyingKey::from_bytes(&bytes).map_err(|_| KeyError::WeakKey)?;
    if key.is_weak() {
        return Err(KeyError::WeakKey);
    }
    Ok(key)
}

/// A fresh signing key from the operating system's random source.
pub fn generate() -> Result<SigningKey, KeyError> {
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).map_err(|e| KeyError::Io(format!("no randomness: {e}")))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// First line of a seed file: says what the file is (a secret), so no tool mistakes it for a
/// public key or the other way round.
pub const SEED_HEADER: &str = "# chio ed25519 signing seed: SECRET, keep it 0600";

/// Write the seed (the header, then hex) to `path`, created 0600 and never overwriting.
pub fn write_seed(path: &Path, key: &SigningKey) -> Result<(), KeyError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| KeyError::Io(format!("creating {}: {e}", path.display())))?;
    writeln!(f, "{SEED_HEADER}\n{}", hex(&key.to_bytes()))
        .map_err(|e| KeyError::Io(format!("writing {}: {e}", path.display())))?;
    f.sync_all().map_err(|e| KeyError::Io(format!("syncing {}: {e}", path.display())))
}

/// Read a seed file; refused when group or others may read it, or when it belongs to neither
/// this process's user nor root (that user could replace the key this process signs with: a
/// root supervisor must not sign receipts with a key an unprivileged user chose). The checks
/// are made on the open file that is then read, not on the path again.
pub fn read_seed(path: &Path) -> Result<SigningKey, KeyError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let io = |e: std::io::Error| KeyError::Io(format!("{}: {e}", path.display()));
    let mut file = fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(KeyError::Io(format!("{}: not a regular file", path.display())));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions(format!(
            "{} has mode {mode:03o}; a secret seed must not be readable by group or others (chmod 600)",
            path.display()
        )));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(KeyError::Permissions(format!(
            "{} belongs to uid {}, not to uid {me} who signs with it (nor root): its owner could replace the key \
             (chown it to uid {me})",
            path.display(),
            meta.uid()
        )));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(io)?;
    // Seeds from before the header are the bare hex line.
    let body = text.strip_prefix(SEED_HEADER).unwrap_or(&text);
    let seed = unhex::<32>(body.trim(), &format!("the seed in {}", path.display()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Sign `msg`; the signature as lowercase hex.
pub fn sign(key: &SigningKey, msg: &[u8]) -> String {
    hex(&key.sign(msg).to_bytes())
}

/// Verify a hex signature strictly (no malleable or small-order forms).
pub fn verify(key: &VerifyingKey, msg: &[u8], sig_hex: &str) -> Result<(), KeyError> {
    let sig = Signature::from_bytes(&unhex::<64>(sig_hex, "signature")?);
    key.verify_strict(msg, &sig).map_err(|_| KeyError::BadSignature)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_tamper() {
        let k = generate().unwrap();
        let pk = public_key(&hex(k.verifying_key().as_bytes())).unwrap();
        let sig = sign(&k, b"hello");
        assert!(verify(&pk, b"hello", &sig).is_ok());
        assert_eq!(verify(&pk, b"hellp", &sig), Err(KeyError::BadSignature));
        let other = generate().unwrap();
        assert_eq!(verify(&other.verifying_key(), b"hello", &sig), Err(KeyError::BadSignature));
        assert!(matches!(verify(&pk, b"hello", &sig.to_uppercase()), Err(KeyError::Encoding(_))));
    }

    #[test]
    fn weak_and_malformed_keys_are_refused() {
        // The identity point (small order) encoded as 01 00..00.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert_eq!(public_key(&hex(&identity)), Err(KeyError::WeakKey));
        assert!(matches!(public_key("abc"), Err(KeyError::Encoding(_))));
        assert!(matches!(public_key(&"G".repeat(64)), Err(KeyError::Encoding(_))));
    }

    #[test]
    fn seed_files_are_private() {
        let dir = std::env::temp_dir().join(format!("chio-keys-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("seed");
        let k = generate().unwrap();
        write_seed(&path, &k).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(read_seed(&path).unwrap().to_bytes(), k.to_bytes());
        assert!(matches!(write_seed(&path, &k), Err(KeyError::Io(_))), "never overwrites");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(read_seed(&path), Err(KeyError::Permissions(_))));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let others = if me == 0 {
            // A seed another user owns: that user could swap the key root signs with.
            std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
            Some(read_seed(&path))
        } else {
            None
        };
        assert!(matches!(read_seed(&dir), Err(KeyError::Io(_))), "a directory is no seed");
        fs::remove_dir_all(&dir).unwrap();
        if let Some(r) = others {
            assert!(matches!(&r, Err(KeyError::Permissions(e)) if e.contains("belongs to uid 65534")), "{r:?}");
        }
    }
}
