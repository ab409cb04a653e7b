//! sftp status codes to errnos. SFTP v3 has six codes for every errno: OpenSSH's sftp-server
//! maps ENOENT, ENOTDIR, EBADF and ELOOP to NO_SUCH_FILE, EPERM, EACCES and EFAULT to
//! PERMISSION_DENIED, ENAMETOOLONG and EINVAL to BAD_MESSAGE, ENOSYS to OP_UNSUPPORTED, and
//! everything else (EEXIST, ENOTEMPTY, EISDIR, ENOSPC, EROFS, EXDEV, ...) to FAILURE. Where
//! an operation's FAILURE has a likely errno the caller tells it apart by looking at the
//! names involved (one LSTAT, as sshfs does): see `Status` users in the store.

use openssh_sftp_client_lowlevel::{Error, SftpErrorKind};
use tierfs_store::Errno;

/// What a request answered, before the caller gives it a meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    NoSuchFile,
    PermDenied,
    /// SSH_FX_FAILURE: an errno sftp has no code for.
    Failure,
    BadMessage,
    Unsupported,
    /// Not a status of the server: the connection died or the request timed out (ENOTCONN),
    /// or the answer made no sense (EIO).
    Local(Errno),
}

impl Status {
    /// The errno when nothing more is known.
    pub(crate) fn errno(self) -> Errno {
        match self {
            Status::NoSuchFile => Errno::ENOENT,
            Status::PermDenied => Errno(libc::EACCES),
            Status::Failure => Errno::EIO,
            Status::BadMessage => Errno::EINVAL,
            Status::Unsupported => Errno(libc::EOPNOTSUPP),
            Status::Local(e) => e,
        }
    }
}

impl From<Errno> for Status {
    fn from(e: Errno) -> Status {
        Status::Local(e)
    }
}

impl From<Status> for Errno {
    fn from(s: Status) -> Errno {
        s.errno()
    }
}

/// What the client library reported.
pub(crate) fn status(e: &Error) -> Status {
    match e {
        Error::SftpError(kind, _) => match kind {
            SftpErrorKind::NoSuchFile => Status::NoSuchFile,
            SftpErrorKind::PermDenied => Status::PermDenied,
            SftpErrorKind::Failure => Status::Failure,
            SftpErrorKind::BadMessage => Status::BadMessage,
            SftpErrorKind::OpUnsupported => Status::Unsupported,
            _ => Status::Failure,
        },
        // The pipe to ssh broke: the connection is gone.
        Error::IOError(_) => Status::Local(Errno::ENOTCONN),
        _ => Status::Local(Errno::EIO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        assert_eq!(Status::NoSuchFile.errno(), Errno::ENOENT);
        assert_eq!(Status::PermDenied.errno(), Errno(libc::EACCES));
        assert_eq!(Status::Unsupported.errno(), Errno(libc::EOPNOTSUPP));
        let io = Error::IOError(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(status(&io).errno(), Errno::ENOTCONN);
    }
}
