package jail

import "golang.org/x/sys/unix"

var nativeSeccompArch = seccompArch{audit: unix.AUDIT_ARCH_AARCH64}
