// flagos-smi's table: a GetStats reply as an operator reads it (devices with
// memory and utilisation; sessions with pid, uid, torch version, streams,
// memory and command line).
#ifndef FLAGOS_CLIENT_SMI_STATS_TABLE_H_
#define FLAGOS_CLIENT_SMI_STATS_TABLE_H_

#include <string>

#include "flagos/v1/flagos.pb.h"

namespace flagos::smi {

// `previous`, when not null, is the reply of the last refresh: each
// device's utilisation is then its busy seconds over the time between the
// two (else the daemon's figure for the last second). `width` bounds the
// command-line column's line (0: unbounded).
std::string FormatStats(const std::string& endpoint, const v1::GetStatsResponse& stats,
                        const v1::GetStatsResponse* previous, double seconds_since_previous,
                        int width);

}  // namespace flagos::smi

#endif  // FLAGOS_CLIENT_SMI_STATS_TABLE_H_
