#include "transport/reply_writer.h"

#include <sys/socket.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "logging.h"

namespace flagos::daemon {
namespace {

// Sends what `fd` takes of `bytes` from `*sent` on; with `flags`
// MSG_DONTWAIT it stops when the socket would block. False when the socket
// failed (peer gone, shut down).
bool SendSome(int fd, const OwnedBytes& bytes, size_t* sent, int flags) {
  while (*sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + *sent, bytes.size() - *sent, MSG_NOSIGNAL | flags);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && (flags & MSG_DONTWAIT)) return true;
    if (n <= 0) return false;
    *sent += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

ReplyWriter::ReplyWriter(uint64_t session_id, WriteFn write, EndFn end, uint64_t max_unread_bytes)
    : session_id_(session_id),
      write_(std::move(write)),
      end_(std::move(end)),
      max_unread_bytes_(max_unread_bytes),
      thread_(&ReplyWriter::Run, this) {}

ReplyWriter::~ReplyWriter() { Stop(); }

absl::Status ReplyWriter::UnreadRepliesExceeded(uint64_t session_id, uint64_t bound) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "session ", session_id, " has more than ", bound,
      " bytes of replies it has not read (kMaxUnreadReplyBytes): the client does not read its "
      "replies; flagosd ended the session and freed what it held. Read the session stream "
      "(and the sync channel) while commands that owe replies are outstanding"));
}

uint64_t ReplyWriter::unread_bytes() const {
  absl::MutexLock lock(&mu_);
  return unread_bytes_;
}

void ReplyWriter::DropPendingLocked() {
  for (const v1::Completion& completion : outbox_) unread_bytes_ -= completion.ByteSizeLong();
  outbox_.clear();
  unread_bytes_ -= sync_pending_bytes_;
  sync_pending_.clear();
  sync_pending_bytes_ = 0;
}

bool ReplyWriter::ReserveLocked(uint64_t bytes) {
  if (exceeded_) return false;
  if (unread_bytes_ + bytes <= max_unread_bytes_) {
    unread_bytes_ += bytes;
    return true;
  }
  exceeded_ = true;
  DropPendingLocked();
  return false;
}

void ReplyWriter::PostCompletion(v1::Completion completion) {
  bool ended = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || stream_gone_ || exceeded_) return;
    if (!ReserveLocked(completion.ByteSizeLong())) {
      ended = true;
    } else {
      outbox_.push_back(std::move(completion));
    }
  }
  if (ended) {
    const absl::Status status = UnreadRepliesExceeded(session_id_, max_unread_bytes_);
    LogWarning(std::string(status.message()));
    end_(status);
  }
}

void ReplyWriter::PostSyncFrame(int fd, std::string frame, OwnedBytes payload) {
  bool ended = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || sync_gone_ || exceeded_) return;
    sync_fd_ = fd;
    Piece pieces[2] = {{OwnedBytes(std::move(frame)), 0}, {std::move(payload), 0}};
    if (sync_pending_.empty() && !sync_in_flight_) {
      // The fast path: the socket takes the whole reply now, as a reply
      // the client waits for usually does.
      for (Piece& piece : pieces) {
        if (!SendSome(fd, piece.bytes, &piece.sent, MSG_DONTWAIT)) {
          sync_gone_ = true;
          return;
        }
        if (piece.sent < piece.bytes.size()) break;  // the socket is full
      }
    }
    const uint64_t left = pieces[0].bytes.size() - pieces[0].sent + pieces[1].bytes.size() -
                          pieces[1].sent;
    if (left == 0) return;
    if (!ReserveLocked(left)) {
      ended = true;
    } else {
      for (Piece& piece : pieces) {
        if (piece.sent < piece.bytes.size()) sync_pending_.push_back(std::move(piece));
      }
      sync_pending_bytes_ += left;
    }
  }
  if (ended) {
    const absl::Status status = UnreadRepliesExceeded(session_id_, max_unread_bytes_);
    LogWarning(std::string(status.message()));
    end_(status);
  }
}

void ReplyWriter::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    const auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || finishing_ || !outbox_.empty() || !sync_pending_.empty();
    };
    mu_.Await(absl::Condition(&has_work));
    if (stopping_) return;
    if (!sync_pending_.empty()) {
      // Sync bytes first: the client waits for them in a blocking call.
      std::deque<Piece> pieces;
      pieces.swap(sync_pending_);
      const uint64_t bytes = sync_pending_bytes_;
      sync_pending_bytes_ = 0;
      const int fd = sync_fd_;
      sync_in_flight_ = true;
      mu_.Unlock();
      bool ok = true;
      for (Piece& piece : pieces) {
        if (!(ok = SendSome(fd, piece.bytes, &piece.sent, 0))) break;
      }
      pieces.clear();
      mu_.Lock();
      sync_in_flight_ = false;
      unread_bytes_ -= bytes;
      if (!ok) {
        sync_gone_ = true;
        unread_bytes_ -= sync_pending_bytes_;
        sync_pending_.clear();
        sync_pending_bytes_ = 0;
      }
      continue;
    }
    if (!outbox_.empty()) {
      v1::ServerMessage message;
      uint64_t bytes = 0;
      while (!outbox_.empty()) {
        const uint64_t size = outbox_.front().ByteSizeLong();
        if (bytes > 0 && bytes + size > kMaxReplyBatchBytes) break;
        bytes += size;
        *message.add_completions() = std::move(outbox_.front());
        outbox_.pop_front();
      }
      stream_in_flight_ = true;
      mu_.Unlock();
      const bool ok = write_(message);
      mu_.Lock();
      stream_in_flight_ = false;
      unread_bytes_ -= bytes;
      if (!ok) {
        stream_gone_ = true;
        for (const v1::Completion& completion : outbox_) {
          unread_bytes_ -= completion.ByteSizeLong();
        }
        outbox_.clear();
      }
      continue;
    }
    // finishing_ and nothing left.
    return;
  }
}

void ReplyWriter::Finish() {
  {
    absl::MutexLock lock(&mu_);
    finishing_ = true;
  }
  if (thread_.joinable()) thread_.join();
  Stop();
}

void ReplyWriter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    DropPendingLocked();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace flagos::daemon
