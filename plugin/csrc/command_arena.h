// CommandArena: a protobuf arena over a block in the caller's frame, for
// building one command that Enqueue serializes at once (the client keeps a
// batch as wire bytes: client/src/encoded_batch.h). An operator's command
// (the call, its argument Values, TensorRefs and their sizes and strides)
// is a dozen small messages; on the heap each is a malloc and a free per
// operator, here they are carved from the block and dropped with the frame.
// A command that outgrows the block continues on heap blocks the arena
// frees.
//
// Only for commands that do not outlive the frame: Enqueue copies what it
// keeps (a graph capture copies the command).
#ifndef TORCH_FL_CSRC_COMMAND_ARENA_H_
#define TORCH_FL_CSRC_COMMAND_ARENA_H_

#include <google/protobuf/arena.h>

#include <cstddef>

#include "flagos/v1/flagos.pb.h"

namespace torch_fl {

class CommandArena {
 public:
  CommandArena() : arena_(Options(block_)) {}
  CommandArena(const CommandArena&) = delete;
  CommandArena& operator=(const CommandArena&) = delete;

  // A new, empty command on the arena; valid until the CommandArena goes.
  flagos::v1::Command& NewCommand() {
    return *google::protobuf::Arena::CreateMessage<flagos::v1::Command>(&arena_);
  }

 private:
  // Holds a tiny operator's command (about 1 KiB for a binary op) with room.
  static constexpr size_t kBlockBytes = 4096;

  static google::protobuf::ArenaOptions Options(char* block) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = kBlockBytes;
    return options;
  }

  alignas(16) char block_[kBlockBytes];
  google::protobuf::Arena arena_;
};

}  // namespace torch_fl

#endif  // TORCH_FL_CSRC_COMMAND_ARENA_H_
