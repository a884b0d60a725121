package e2e_test

import "golang.org/x/sys/unix"

// socketNetNS is the inode of the network namespace of pid's socket fd,
// through a copy of the descriptor (pidfd_getfd; this test runs as root).
func socketNetNS(pid, fd int) (uint64, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(pidfd)
	mine, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(mine)
	const siocgskns = 0x894C // the socket's network namespace, as a descriptor
	ns, err := unix.IoctlRetInt(mine, siocgskns)
	if err != nil {
		return 0, err
	}
	defer unix.Close(ns)
	var st unix.Stat_t
	if err := unix.Fstat(ns, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}
