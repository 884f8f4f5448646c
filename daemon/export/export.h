/* export.h — the weight exports, the TrainingEngine methods that hand the
 * engine's parameters out: GetPerTensorParam (stream.c, a stream of
 * buckets) and ShareWeights (share.c, a memfd for a process on this host).
 * Their helpers sit beside them in export/: the exported tensors and their
 * conversion (params.c), the pending shares (share_table.c) and the side
 * socket that hands them over (share_socket.c). Same layer as handlers.h. */
#ifndef ENGINED_DAEMON_EXPORT_H
#define ENGINED_DAEMON_EXPORT_H

#include "daemon.h"

/* stream.c: GetPerTensorParam */
int h_validate_get_params(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_get_params(struct daemon *d, struct job *j, struct eng_error *err);

/* share.c: ShareWeights */
int h_validate_share_weights(struct daemon *d, struct job *j, struct eng_error *err);
int h_run_share_weights(struct daemon *d, struct job *j, struct eng_error *err);

#endif
