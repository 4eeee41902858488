/* Test fixture: a stand-in for krakl-backend-host that speaks the isolation protocol
 * (Sources/KraklHost/Isolation/IsolationWire.swift) and then breaks it in one chosen way, to
 * prove the agent reads everything the child sends as hostile input. The agent passes the
 * backend's name as the second argument; here it names the misbehaviour:
 *
 *   good          a valid 64x32 BGRx frame (the control case: the stand-in itself is right)
 *   bad-slot      a frame in slot 7 of a 2-slot ring
 *   bad-offset    a frame whose plane lies past the end of its slot
 *   bad-damage    a damage rectangle outside the frame
 *   unsealed      a ring whose memfd may still shrink
 *   wrong-size    a ring message that claims more bytes than the memfd has
 *   long-text     a log line that claims 100000 bytes
 *   unasked-reply a reply to a command that was not sent
 *   garbage       a message of an unknown kind
 *
 *   hostile_backend_host LIBRARY MODE SLOTS WAIT-MS   (the agent's socket on fd 3)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { CREATE = 1, START, STOP, DESTROY, LIST, RELEASE, READY = 100, LOAD_FAILED, REPLY, LOG, EVENT, FOUND, RING, FRAME };

static uint8_t out[65536];
static size_t used;

static void begin(uint32_t kind) { used = 0; memcpy(out, &kind, 4); used = 4; }
static void u32(uint32_t v) { memcpy(out + used, &v, 4); used += 4; }
static void i32(int32_t v) { memcpy(out + used, &v, 4); used += 4; }
static void u64(uint64_t v) { memcpy(out + used, &v, 8); used += 8; }
static void text(const char *s) { u32((uint32_t)strlen(s)); memcpy(out + used, s, strlen(s)); used += strlen(s); }

static void send_plain(void) { send(3, out, used, MSG_NOSIGNAL); }

static void send_with_fd(int fd) {
    struct iovec iov = {out, used};
    char control[CMSG_SPACE(sizeof(int))];
    memset(control, 0, sizeof control);
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    sendmsg(3, &msg, MSG_NOSIGNAL);
}

static void reply(uint32_t call) {
    begin(REPLY); u32(call); u32(1); i32(0); text("");
    send_plain();
}

#define SLOT 16384u /* 64x32 BGRx = 8192 bytes, rounded to pages; the agent does not check our layout */

static void send_ring(int sealed, uint64_t claimed_slot) {
    int fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (ftruncate(fd, 2 * SLOT) != 0) exit(1);
    if (sealed) fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
    uint8_t *pixels = mmap(NULL, 2 * SLOT, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    for (uint32_t i = 0; i < 2 * SLOT; i++) pixels[i] = (uint8_t)(i * 7);
    begin(RING); u32(1); u32(2); u64(claimed_slot);
    send_with_fd(fd);
    close(fd);
}

static void send_frame(uint32_t slot, uint64_t offset, int32_t damage_x) {
    begin(FRAME);
    u32(1); u32(slot); u32(1 /* BGRX */); u32(64); u32(32); u32(1);
    u32(256); u32(0); u32(0); u32(0);
    u64(offset); u64(0); u64(0); u64(0);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    u64((uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec);
    u64(1); u32(0);          /* sequence, dropped */
    u32(0); u32(0);          /* damage flags (checked by the child), NULL-damage count */
    u32(1); i32(damage_x); i32(0); i32(16); i32(16);
    u32(0);
    send_plain();
}

static void misbehave(const char *mode) {
    if (!strcmp(mode, "unsealed")) { send_ring(0, SLOT); return; }
    if (!strcmp(mode, "wrong-size")) { send_ring(1, 2 * SLOT); return; }
    if (!strcmp(mode, "long-text")) { begin(LOG); i32(1); u32(100000); send_plain(); return; }
    if (!strcmp(mode, "unasked-reply")) { reply(DESTROY); return; }
    if (!strcmp(mode, "garbage")) { begin(9999); u32(1); send_plain(); return; }
    send_ring(1, SLOT);
    if (!strcmp(mode, "good")) send_frame(1, 0, 0);
    if (!strcmp(mode, "bad-slot")) send_frame(7, 0, 0);
    if (!strcmp(mode, "bad-offset")) send_frame(0, SLOT - 1024, 0);
    if (!strcmp(mode, "bad-damage")) send_frame(0, 0, 60);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    begin(READY); u32(1); u32(1); u32(0); text("hostile"); text("a stand-in that breaks the protocol");
    send_plain();
    uint8_t in[70000];
    for (;;) {
        ssize_t n = recv(3, in, sizeof in, 0);
        if (n <= 0) return 0;
        uint32_t kind;
        memcpy(&kind, in, 4);
        switch (kind) {
        case CREATE: reply(CREATE); break;
        case START: reply(START); misbehave(argv[2]); break;
        case STOP: reply(STOP); break;
        case DESTROY: reply(DESTROY); return 0;
        default: break;
        }
    }
}
