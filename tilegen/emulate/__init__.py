"""Run Arm64 code on any host: qemu-user provisioning, guest commands, `tilegen emulate`."""
