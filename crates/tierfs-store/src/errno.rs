use std::fmt;

/// A POSIX errno value. Every store error is one, so it can reach the application unchanged.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

pub type Result<T> = std::result::Result<T, Errno>;

impl Errno {
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENOTSUP: Errno = Errno(libc::ENOTSUP);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ELOOP: Errno = Errno(libc::ELOOP);
    pub const ESTALE: Errno = Errno(libc::ESTALE);
    /// What every call on a FUSE filesystem whose daemon died returns.
    pub const ENOTCONN: Errno = Errno(libc::ENOTCONN);

    /// The errno of the last failed libc call on this thread.
    pub fn last() -> Errno {
        Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Self {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for Errno {}
